/* Mlocks 1,000 pages of one fresh mapping from one function, then touches 40,960 of
 * another from a second, for tests/stacks.rs: every fault of each has the same stack, so
 * the stack table, the folded file and the mapping row must each say 40,960 and 1,000.
 * Pinned to one CPU first: the kernel keeps one fault's stack in N per CPU, so 40,960 faults
 * in a row on one CPU keep exactly 40,960 / N; the mlock's 1,000 pages are one sample.
 * Prints each mapping's range as /proc/PID/maps writes it, and lives on a little, so the
 * tracer reads its mappings. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGE 4096
#define PAGES 40960
#define LOCKED 1000

__attribute__((noinline)) void touch_pages(volatile char *p, long pages) {
    for (long i = 0; i < pages; i++)
        p[i * PAGE] = 1;
}

__attribute__((noinline)) int lock_pages(char *p, long pages) {
    int r = mlock(p, pages * PAGE);
    __asm__ volatile("" ::: "memory");
    return r;
}

int main(void) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(0, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0) {
        perror("sched_setaffinity");
        return 2;
    }
    /* Locked first, so that the touched mapping cannot merge with it in between. */
    int prot = PROT_READ | PROT_WRITE, flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    char *q = mmap(0, (long)LOCKED * PAGE, prot, flags, -1, 0);
    if (q == MAP_FAILED || lock_pages(q, LOCKED) != 0) {
        perror("mlock");
        return 1;
    }
    char *p = mmap(0, (long)PAGES * PAGE, prot, flags, -1, 0);
    if (p == MAP_FAILED)
        return 1;
    touch_pages(p, PAGES);
    printf("%lx-%lx\n", (unsigned long)p, (unsigned long)(p + (long)PAGES * PAGE));
    printf("%lx-%lx\n", (unsigned long)q, (unsigned long)(q + (long)LOCKED * PAGE));
    fflush(stdout);
    usleep(500000);
    return 0;
}
