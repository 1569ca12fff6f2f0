/* A traced program that names everything it can with terminal escapes and newlines, the way
 * an attacker would (tests/hostile_names.rs): its comm (prctl), a thread's name, a mapped
 * file, a memfd, a file whose name is not UTF-8, and (renamed with objcopy after the build)
 * the function that makes its mlock calls. It touches every page of each mapping (so that
 * each is a row of the fault table), then mlocks it; a thread mlocks an anonymous mapping
 * it has not touched: 4 mlock calls of PAGES pages each.
 *
 * usage: hostile DIR   (DIR: where to create the files) */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PAGES 4
#define COMM "e\033]0;X\007\nFAKE"
#define THREAD_NAME "t\033[2J\nFAKE"
#define FILE_NAME "map\033]0;PWNED\007\nFAKE file"
#define MEMFD_NAME "memfd\033[2J\nFAKE memfd"
#define BAD_UTF8_NAME "bad\377\376 name"

/* mlock by a raw syscall instruction, so that the innermost frame of the call's user stack
 * is this function (renamed by the test to a hostile, over-long symbol). */
__attribute__((noinline)) long hostile_symbol(void *addr, size_t len) {
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"((long)SYS_mlock), "D"(addr), "S"(len)
                     : "rcx", "r11", "memory");
    return ret;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

/* The tracer counts faults without a VMA per 64 KiB region: each mapping gets one of its
 * own (inside a PROT_NONE reservation, which takes no fault), to be a row of its own. */
#define REGION (64 * 1024)

static char *map_fd(int fd, long size) {
    if (ftruncate(fd, size) != 0) die("ftruncate");
    char *hole = mmap(NULL, 2 * REGION, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (hole == MAP_FAILED) die("mmap reservation");
    char *at = (char *)(((unsigned long)hole + REGION - 1) & ~(unsigned long)(REGION - 1));
    char *p = mmap(at, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) die("mmap");
    for (long i = 0; i < size; i += 4096) p[i] = 1;
    return p;
}

static char *map_file(const char *dir, const char *name, long size) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) die("open");
    return map_fd(fd, size);
}

static void *thread_main(void *arg) {
    long size = *(long *)arg;
    char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) die("mmap");
    /* Not touched first: the mlock populates its pages, faults counted at its call site. */
    if (hostile_symbol(p, size) != 0) die("mlock in thread");
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    if (prctl(PR_SET_NAME, COMM) != 0) die("prctl");
    long size = PAGES * sysconf(_SC_PAGESIZE);

    char *file = map_file(argv[1], FILE_NAME, size);
    if (hostile_symbol(file, size) != 0) die("mlock file");

    char *bad = map_file(argv[1], BAD_UTF8_NAME, size);
    if (hostile_symbol(bad, size) != 0) die("mlock bad");

    int mfd = memfd_create(MEMFD_NAME, 0);
    if (mfd < 0) die("memfd_create");
    char *memfd = map_fd(mfd, size);
    if (hostile_symbol(memfd, size) != 0) die("mlock memfd");

    /* A thread inherits its creator's name, and the tracer names a thread by its name at
     * its first fault (inside pthread_create's start-up): born named. */
    pthread_t t;
    if (prctl(PR_SET_NAME, THREAD_NAME) != 0) die("prctl thread");
    if (pthread_create(&t, NULL, thread_main, &size) != 0) die("pthread_create");
    if (prctl(PR_SET_NAME, COMM) != 0) die("prctl back");
    if (pthread_join(t, NULL) != 0) die("pthread_join");

    /* Leave the mappings in place long enough for the tracer to read them (every 40 ms): a
     * second, as in CI the host stage shares 2 CPUs with four emulated guests, and 300 ms
     * once passed without a read (the rows then named by the kernel's file name alone). */
    usleep(1000 * 1000);
    return 0;
}
