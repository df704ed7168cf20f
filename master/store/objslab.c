/*
 * objslab.c - size-classed slab for object metadata; see objslab.h.
 *
 * Chunks are 2 MiB, mmap'd at a 2 MiB boundary and advised MADV_HUGEPAGE
 * (ignored where THP is off: still correct, just without the TLB win), so
 * the chunk of any block is its address rounded down.  A chunk starts with
 * its header (list links, live count, its own free list); a class carves
 * blocks from its current chunk by bumping an offset, and reuses freed
 * blocks from the chunks on its `partial` list first.  A chunk whose last
 * block is freed is returned to the system (munmap), except one spare per
 * class kept against churn at a chunk boundary: memory freed by a mass
 * removal goes back instead of staying reserved for good.
 *
 * Locks: classes[i].mu, a leaf.
 */
#include "objslab.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define SLAB_GRAIN 16u
#define SLAB_CHUNK (2u << 20)
#define SLAB_HEADER 64u /* the chunk header's room; blocks start after it */

struct free_block {
    struct free_block *next;
};

/* The two lists of a class a chunk is on, by their links' index. */
enum { ALL, PARTIAL };

struct chunk {
    /* [ALL]: the class's list of chunks; [PARTIAL]: its partial list (chunks
     * with free blocks) */
    struct chunk *prev[2], *next[2];
    struct free_block *free;
    uint32_t live;                   /* blocks handed out and not freed */
    bool partial;
};
_Static_assert(sizeof(struct chunk) <= SLAB_HEADER, "chunk header too large");

struct slab_class {
    pthread_mutex_t mu;
    struct chunk *cur;   /* the chunk being carved */
    char *bump, *end;    /* bump pointer inside cur */
    struct chunk *chunks;
    struct chunk *partial;
    struct chunk *spare; /* one empty chunk kept (not on any list) */
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

static void chunk_unmap(moonlet_objslab *s, struct chunk *ch)
{
    munmap(ch, SLAB_CHUNK);
    atomic_fetch_sub(&s->reserved, SLAB_CHUNK);
}

void moonlet_objslab_destroy(moonlet_objslab *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->nclasses; i++) {
        struct chunk *c = s->classes[i].chunks;
        while (c) {
            struct chunk *next = c->next[ALL];
            chunk_unmap(s, c);
            c = next;
        }
        if (s->classes[i].spare)
            chunk_unmap(s, s->classes[i].spare);
        pthread_mutex_destroy(&s->classes[i].mu);
    }
    free(s);
}

/* 2 MiB of memory at a 2 MiB boundary. */
static void *chunk_map(void)
{
    char *mem = mmap(NULL, 2 * SLAB_CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
    if (mem == MAP_FAILED)
        return NULL;
    uintptr_t a = ((uintptr_t)mem + SLAB_CHUNK - 1) & ~(uintptr_t)(SLAB_CHUNK - 1);
    char *al = (char *)a;
    if (al > mem)
        munmap(mem, (size_t)(al - mem));
    if (al + SLAB_CHUNK < mem + 2 * SLAB_CHUNK)
        munmap(al + SLAB_CHUNK, (size_t)(mem + 2 * SLAB_CHUNK - (al + SLAB_CHUNK)));
    madvise(al, SLAB_CHUNK, MADV_HUGEPAGE);
    return al;
}

static struct chunk *chunk_of(const void *p)
{
    return (struct chunk *)((uintptr_t)p & ~(uintptr_t)(SLAB_CHUNK - 1));
}

/* Puts ch first on the list `l` (ALL or PARTIAL) that starts at *head. */
static void list_push(struct chunk **head, struct chunk *ch, int l)
{
    ch->prev[l] = NULL;
    ch->next[l] = *head;
    if (*head)
        (*head)->prev[l] = ch;
    *head = ch;
}

/* Takes ch off the list `l` that starts at *head. */
static void list_unlink(struct chunk **head, struct chunk *ch, int l)
{
    if (ch->prev[l])
        ch->prev[l]->next[l] = ch->next[l];
    else
        *head = ch->next[l];
    if (ch->next[l])
        ch->next[l]->prev[l] = ch->prev[l];
}

static void partial_add(struct slab_class *c, struct chunk *ch)
{
    list_push(&c->partial, ch, PARTIAL);
    ch->partial = true;
}

static void partial_del(struct slab_class *c, struct chunk *ch)
{
    list_unlink(&c->partial, ch, PARTIAL);
    ch->partial = false;
}

/* A fresh chunk (the spare, or new memory) becomes the one being carved. */
static int class_grow_locked(moonlet_objslab *s, struct slab_class *c)
{
    struct chunk *ch = c->spare;
    c->spare = NULL;
    if (!ch) {
        if (!(ch = chunk_map()))
            return -1;
        atomic_fetch_add(&s->reserved, SLAB_CHUNK);
    }
    memset(ch, 0, sizeof(*ch));
    list_push(&c->chunks, ch, ALL);
    c->cur = ch;
    c->bump = (char *)ch + SLAB_HEADER;
    c->end = (char *)ch + SLAB_CHUNK;
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
    if (c->partial) {
        struct chunk *ch = c->partial;
        struct free_block *b = ch->free;
        ch->free = b->next;
        if (!ch->free)
            partial_del(c, ch);
        ch->live++;
        p = b;
    } else if ((c->cur && (size_t)(c->end - c->bump) >= size) || class_grow_locked(s, c) == 0) {
        p = c->bump;
        c->bump += size;
        c->cur->live++;
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
    struct chunk *ch = chunk_of(p);
    struct free_block *b = p;
    struct chunk *unmap = NULL;
    pthread_mutex_lock(&c->mu);
    if (--ch->live == 0 && ch != c->cur) {
        /* empty: off every list, then kept as the spare or returned */
        if (ch->partial)
            partial_del(c, ch);
        list_unlink(&c->chunks, ch, ALL);
        if (!c->spare)
            c->spare = ch;
        else
            unmap = ch;
    } else {
        b->next = ch->free;
        ch->free = b;
        if (!ch->partial)
            partial_add(c, ch);
    }
    pthread_mutex_unlock(&c->mu);
    if (unmap)
        chunk_unmap(s, unmap);
}

size_t moonlet_objslab_reserved(moonlet_objslab *s)
{
    return atomic_load(&s->reserved);
}
