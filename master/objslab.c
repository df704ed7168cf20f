/*
 * objslab.c - size-classed slab for object metadata; see objslab.h.
 *
 * A class carves blocks from its current chunk by bumping an offset and
 * keeps freed blocks on an intrusive free list.  Chunks are 2 MiB, mmap'd
 * and advised MADV_HUGEPAGE (ignored where THP is off: still correct, just
 * without the TLB win).
 *
 * Locks: classes[i].mu, a leaf.
 */
#include "objslab.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define SLAB_GRAIN 16u
#define SLAB_CHUNK (2u << 20)

struct free_block {
    struct free_block *next;
};

struct chunk {
    struct chunk *next;
};

struct slab_class {
    pthread_mutex_t mu;
    struct free_block *free;
    char *cur;       /* bump pointer inside the current chunk */
    char *end;
    struct chunk *chunks;
};

struct moonlet_objslab {
    size_t max_size;
    size_t nclasses;
    _Atomic size_t reserved;
    struct slab_class classes[];
};

moonlet_objslab *moonlet_objslab_create(size_t max_size)
{
    max_size = (max_size + SLAB_GRAIN - 1) & ~(size_t)(SLAB_GRAIN - 1);
    if (max_size == 0 || max_size > SLAB_CHUNK / 4)
        return NULL;
    size_t n = max_size / SLAB_GRAIN;
    moonlet_objslab *s = calloc(1, sizeof(*s) + n * sizeof(struct slab_class));
    if (!s)
        return NULL;
    s->max_size = max_size;
    s->nclasses = n;
    for (size_t i = 0; i < n; i++)
        pthread_mutex_init(&s->classes[i].mu, NULL);
    return s;
}

void moonlet_objslab_destroy(moonlet_objslab *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->nclasses; i++) {
        struct chunk *c = s->classes[i].chunks;
        while (c) {
            struct chunk *next = c->next;
            munmap(c, SLAB_CHUNK);
            c = next;
        }
        pthread_mutex_destroy(&s->classes[i].mu);
    }
    free(s);
}

/* A fresh chunk for class c; the first block holds the chunk link. */
static int class_grow_locked(moonlet_objslab *s, struct slab_class *c)
{
    void *mem = mmap(NULL, SLAB_CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED)
        return -1;
    madvise(mem, SLAB_CHUNK, MADV_HUGEPAGE);
    struct chunk *ch = mem;
    ch->next = c->chunks;
    c->chunks = ch;
    c->cur = (char *)mem + SLAB_GRAIN;
    c->end = (char *)mem + SLAB_CHUNK;
    atomic_fetch_add(&s->reserved, SLAB_CHUNK);
    return 0;
}

void *moonlet_objslab_alloc(moonlet_objslab *s, size_t size)
{
    size = (size + SLAB_GRAIN - 1) & ~(size_t)(SLAB_GRAIN - 1);
    if (size == 0 || size > s->max_size)
        return size ? calloc(1, size) : NULL;
    struct slab_class *c = &s->classes[size / SLAB_GRAIN - 1];
    void *p = NULL;
    pthread_mutex_lock(&c->mu);
    if (c->free) {
        p = c->free;
        c->free = c->free->next;
    } else if ((c->cur && (size_t)(c->end - c->cur) >= size) || class_grow_locked(s, c) == 0) {
        p = c->cur;
        c->cur += size;
    }
    pthread_mutex_unlock(&c->mu);
    if (p)
        memset(p, 0, size);
    return p;
}

void moonlet_objslab_free(moonlet_objslab *s, void *p, size_t size)
{
    if (!p)
        return;
    size = (size + SLAB_GRAIN - 1) & ~(size_t)(SLAB_GRAIN - 1);
    if (size > s->max_size) {
        free(p);
        return;
    }
    struct slab_class *c = &s->classes[size / SLAB_GRAIN - 1];
    struct free_block *b = p;
    pthread_mutex_lock(&c->mu);
    b->next = c->free;
    c->free = b;
    pthread_mutex_unlock(&c->mu);
}

size_t moonlet_objslab_reserved(moonlet_objslab *s)
{
    return atomic_load(&s->reserved);
}
