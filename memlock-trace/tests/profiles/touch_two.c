/* Page faults from two known functions, for tests/profiles.rs: touch_small touches 256
 * pages, touch_large 512, each called from main. Built with -O0 -fno-omit-frame-pointer so
 * that perf's frame-pointer walk (`perf record -g`) reaches main as DWARF unwinding does.
 * Prints each call's minor-fault count as getrusage gives it. */
#include <stdio.h>
#include <sys/mman.h>
#include <sys/resource.h>

#define PAGE 4096

static long minflt(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_minflt;
}

__attribute__((noinline)) void touch_small(volatile char *p, long pages) {
    for (long i = 0; i < pages; i++)
        p[i * PAGE] = 1;
}

__attribute__((noinline)) void touch_large(volatile char *p, long pages) {
    for (long i = 0; i < pages; i++)
        p[i * PAGE] = 1;
}

int main(void) {
    int prot = PROT_READ | PROT_WRITE, flags = MAP_PRIVATE | MAP_ANONYMOUS;
    char *a = mmap(0, 256 * PAGE, prot, flags, -1, 0);
    char *b = mmap(0, 512 * PAGE, prot, flags, -1, 0);
    if (a == MAP_FAILED || b == MAP_FAILED)
        return 1;
    long before = minflt();
    touch_small(a, 256);
    long middle = minflt();
    touch_large(b, 512);
    long after = minflt();
    printf("touch_small %ld touch_large %ld\n", middle - before, after - middle);
    return 0;
}
