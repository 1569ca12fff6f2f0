/* main -> lock_a -> lock_b -> mlock, built by tests/support/stacks.rs with -O2
 * -fomit-frame-pointer as distributions build: the frame pointer register (x86's rbp,
 * arm64's x29) holds data, so only the unwind tables (.eh_frame) tell the callers. With `unlink`, the program deletes its own file first:
 * its stack must still be symbolized, from the file as it was mapped. */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__aarch64__)
#define FRAME_POINTER "x29"
#else
#define FRAME_POINTER "rbp"
#endif

static char buf[1 << 16] __attribute__((aligned(4096)));

__attribute__((noinline)) int lock_b(char *p, size_t n) {
    int r = mlock(p, n);
    __asm__ volatile("" ::: "memory");
    return r + 1;
}

__attribute__((noinline)) int lock_a(char *p, size_t n) {
    int r = lock_b(p, n);
    __asm__ volatile("" ::: "memory");
    return r * 3;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "unlink") == 0 && unlink(argv[0]) != 0) {
        perror("unlink");
        return 2;
    }
    /* It holds data, as rbp in memtester's `__GI_mlock <- 0x6c6c252820424d75`. */
    register long data __asm__(FRAME_POINTER) = 0x6c6c252820424d75L;
    __asm__ volatile("" : "+r"(data));
    memset(buf, 1, sizeof buf);
    int r = lock_a(buf, sizeof buf);
    __asm__ volatile("" : : "r"(data));
    return r == 3 ? 0 : 1;
}
