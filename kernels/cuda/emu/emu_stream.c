/* kernels/cuda/emu/emu_stream.c — the emulated device's streams and events: books of the ordering contract (see
 * emu_stream.h). */
#include "kernels/cuda/emu/emu_stream.h"

#include <stdlib.h>

#include "core/error.h"

typedef struct {
    uint64_t magic; /* EMU_EVENT_MAGIC */
    emu_stream *on; /* recorded on (NULL: the table's stream) */
    uint64_t at;    /* the count it marks: on's launched, or the table's stream's GEMMs */
    int recorded;
} emu_event;

#define EMU_EVENT_MAGIC 0x454d554556454e54ULL /* "EMUEVENT" */

static uint64_t compute;   /* GEMMs on the table's stream */
static emu_stream *live;   /* every stream not freed */
static emu_stream *current; /* where entries launch (NULL: the table's stream) */

static emu_stream *as_stream(void *s) {
    emu_stream *x = s;
    return x && x->magic == EMU_STREAM_MAGIC ? x : NULL;
}

void *emu_stream_new(void) {
    emu_stream *s = calloc(1, sizeof *s);
    if (!s) {
        core_error("emulated device: out of memory for a stream");
        return NULL;
    }
    s->magic = EMU_STREAM_MAGIC, s->compute = &compute, s->next = live;
    live = s;
    return s;
}

void emu_stream_free(void *p) {
    emu_stream *s = as_stream(p);
    if (!s) return;
    for (emu_stream **q = &live; *q; q = &(*q)->next)
        if (*q == s) {
            *q = s->next;
            break;
        }
    if (current == s) current = NULL;
    s->magic = 0;
    free(s);
}

void *emu_event_new(void) {
    emu_event *e = calloc(1, sizeof *e);
    if (!e) core_error("emulated device: out of memory for an event");
    else e->magic = EMU_EVENT_MAGIC;
    return e;
}

void emu_event_free(void *p) {
    emu_event *e = p;
    if (e && e->magic == EMU_EVENT_MAGIC) e->magic = 0, free(e);
}

int emu_event_record(void *p, void *s) {
    emu_event *e = p;
    if (!e || e->magic != EMU_EVENT_MAGIC) return core_error("event_record (emulated): not an event");
    if (s && !as_stream(s)) return core_error("event_record (emulated): not a stream of this device");
    e->on = as_stream(s), e->at = e->on ? e->on->launched : compute, e->recorded = 1;
    return 0;
}

int emu_stream_wait(void *s, void *p) {
    emu_event *e = p;
    if (!e || e->magic != EMU_EVENT_MAGIC) return core_error("stream_wait (emulated): not an event");
    if (!e->recorded) return core_error("stream_wait (emulated): the event was never recorded");
    if (s && !as_stream(s)) return core_error("stream_wait (emulated): not a stream of this device");
    emu_stream *w = as_stream(s);
    if (w && !e->on && e->at > w->waited) w->waited = e->at; /* a stream after the table's stream's work */
    if (!w && e->on && e->at > e->on->joined) e->on->joined = e->at; /* the table's stream after a stream's work */
    return 0;
}

void *emu_stream_use(void *s) {
    emu_stream *prev = current;
    current = as_stream(s);
    return prev;
}

void emu_stream_gemm(void) {
    if (!current) compute++;
}

int emu_stream_launch(const char *op) {
    if (!current) return 0;
    if (current->waited != compute)
        return core_error("%s (emulated) on a second stream: it has not waited for the table's stream's latest work "
                          "(an event recorded after it, then stream_wait): on a GPU it would race the backward",
                          op);
    current->launched++;
    return 0;
}

int emu_stream_joined(const char *op) {
    for (emu_stream *s = live; s; s = s->next)
        if (s->launched != s->joined)
            return core_error("%s (emulated): a second stream has work the table's stream has not waited for (%llu "
                              "launched, %llu joined): on a GPU the step would read gradients still being reduced",
                              op, (unsigned long long)s->launched, (unsigned long long)s->joined);
    return 0;
}
