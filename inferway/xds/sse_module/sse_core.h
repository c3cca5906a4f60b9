/* inferway's reader of streamed OpenAI answers (Server-Sent Events): the pure part.
 *
 * It does what the answer side of llm_stream.lua does, in C, so Envoy does not resume a Lua
 * script once per chunk: split the bytes into events (an event may come split across chunks),
 * count the events that carry generated text and time the first and last of them, read the
 * model and the usage block, note "data: [DONE]", and, for a client that did not ask for usage,
 * drop the usage-only event from the bytes passed on (only whole events are passed then).
 * No Envoy here: sse_filter.c is the glue, and tests load this file alone through ctypes. */
#ifndef INFERWAY_SSE_CORE_H
#define INFERWAY_SSE_CORE_H

#include <stddef.h>
#include <stdint.h>

typedef struct inferway_sse inferway_sse;

/* A reader for one answer; drop: remove the usage-only event. NULL when out of memory. */
inferway_sse *inferway_sse_new(int drop);
void inferway_sse_free(inferway_sse *s);

/* Reads one chunk (the bytes as received, possibly none) that arrived at now_us (wall-clock
 * microseconds); end: it is the answer's last. Returns 1 when the chunk must be replaced by
 * *out / *out_len (valid until the next call), 0 when it passes as it is, -1 when out of memory
 * (the chunk then passes as it is and the reader stops reading). An event still unended past
 * 8 MiB is passed on as it is and the reader stops too (inferway_sse_failed). */
int inferway_sse_feed(inferway_sse *s, const char *data, size_t len, int end, int64_t now_us,
                      const char **out, size_t *out_len);

/* What was counted so far. The strings are NUL-terminated and empty when not seen. */
int64_t inferway_sse_chunks(const inferway_sse *s);
int64_t inferway_sse_first_us(const inferway_sse *s); /* 0: no token yet */
int64_t inferway_sse_last_us(const inferway_sse *s);
const char *inferway_sse_prompt(const inferway_sse *s);
const char *inferway_sse_completion(const inferway_sse *s);
const char *inferway_sse_model(const inferway_sse *s);
int inferway_sse_done(const inferway_sse *s);
int inferway_sse_failed(const inferway_sse *s);

#endif
