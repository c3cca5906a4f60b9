/* inferway's SSE reader as an Envoy HTTP filter (a dynamic module; envoy_abi.h). It reads the
 * streamed answers that inferway's LLM processor tagged (dynamic metadata inferway.llm `id`)
 * with sse_core.c, chunk by chunk in Envoy's worker, and writes what it counted into the same
 * metadata: `chunks`, `first` and `last` (wall-clock microseconds, as strings), `prompt` and
 * `completion` (the usage block's), `model_answered`, `done`. It sits after inferway's Lua filter
 * in the chain, so it sees each chunk before that filter does; the Lua filter waits for the
 * answer's end and sends the processor one report from this metadata (llm_stream.lua). For an
 * answer that never ends (the client went away) it writes the metadata when the stream is over,
 * before Envoy's access log reads it. Any other answer is left alone. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "envoy_abi.h"
#include "sse_core.h"

#define EXPORT __attribute__((visibility("default")))
#define TEXT(s) ((module_buffer){(s), sizeof(s) - 1})

static const char NS[] = "inferway.llm";

typedef struct {
  inferway_sse *reader; /* NULL: not an answer to read */
  int written;
  char *joined;
  size_t joined_cap;
} stream;

static int64_t now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (int64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

static void put_string(envoy_filter e, module_buffer key, const char *value) {
  if (value[0] == 0) return;
  envoy_dynamic_module_callback_http_set_dynamic_metadata_string(
      e, TEXT(NS), key, (module_buffer){value, strlen(value)});
}

static void put_micros(envoy_filter e, module_buffer key, int64_t us) {
  if (us == 0) return;
  char text[24];
  snprintf(text, sizeof text, "%lld", (long long)us);
  put_string(e, key, text);
}

static void write_counts(envoy_filter e, stream *st) {
  const inferway_sse *r = st->reader;
  envoy_dynamic_module_callback_http_set_dynamic_metadata_number(e, TEXT(NS), TEXT("chunks"),
                                                                 (double)inferway_sse_chunks(r));
  put_micros(e, TEXT("first"), inferway_sse_first_us(r));
  put_micros(e, TEXT("last"), inferway_sse_last_us(r));
  put_string(e, TEXT("prompt"), inferway_sse_prompt(r));
  put_string(e, TEXT("completion"), inferway_sse_completion(r));
  put_string(e, TEXT("model_answered"), inferway_sse_model(r));
  envoy_dynamic_module_callback_http_set_dynamic_metadata_bool(e, TEXT(NS), TEXT("done"),
                                                               inferway_sse_done(r) != 0);
  st->written = 1;
}

static int is_event_stream(const char *v, size_t n) {
  static const char kind[] = "text/event-stream";
  size_t i = 0;
  while (i < n && (v[i] == ' ' || (v[i] >= '\t' && v[i] <= '\r'))) i++;
  return n - i >= sizeof kind - 1 && strncasecmp(v + i, kind, sizeof kind - 1) == 0;
}

EXPORT const char *envoy_dynamic_module_on_program_init(void) { return INFERWAY_ENVOY_ABI_VERSION; }

EXPORT module_config envoy_dynamic_module_on_http_filter_config_new(void *config_envoy,
                                                                    envoy_buffer name,
                                                                    envoy_buffer config) {
  (void)config_envoy, (void)name, (void)config;
  static const char instance[] = "inferway.sse";
  return instance;
}

EXPORT void envoy_dynamic_module_on_http_filter_config_destroy(module_config config) { (void)config; }

EXPORT module_filter envoy_dynamic_module_on_http_filter_new(module_config config,
                                                             envoy_filter e) {
  (void)config, (void)e;
  return calloc(1, sizeof(stream)); /* NULL: Envoy answers 500 itself */
}

EXPORT void envoy_dynamic_module_on_http_filter_destroy(module_filter m) {
  stream *st = (stream *)m;
  inferway_sse_free(st->reader);
  free(st->joined);
  free(st);
}

EXPORT int envoy_dynamic_module_on_http_filter_request_headers(envoy_filter e, module_filter m,
                                                               bool end) {
  (void)e, (void)m, (void)end;
  return CONTINUE;
}

EXPORT int envoy_dynamic_module_on_http_filter_request_body(envoy_filter e, module_filter m,
                                                            bool end) {
  (void)e, (void)m, (void)end;
  return CONTINUE;
}

EXPORT int envoy_dynamic_module_on_http_filter_request_trailers(envoy_filter e, module_filter m) {
  (void)e, (void)m;
  return CONTINUE;
}

EXPORT int envoy_dynamic_module_on_http_filter_response_headers(envoy_filter e, module_filter m,
                                                                bool end) {
  stream *st = (stream *)m;
  envoy_buffer id = {0}, kind = {0};
  if (end) return CONTINUE;
  if (!envoy_dynamic_module_callback_http_get_metadata_string(e, METADATA_DYNAMIC, TEXT(NS),
                                                              TEXT("id"), &id) ||
      id.length == 0)
    return CONTINUE;
  if (!envoy_dynamic_module_callback_http_get_header(e, HEADER_RESPONSE, TEXT("content-type"),
                                                     &kind, 0, NULL) ||
      !is_event_stream(kind.ptr, kind.length))
    return CONTINUE;
  bool drop = false;
  envoy_dynamic_module_callback_http_get_metadata_bool(e, METADATA_DYNAMIC, TEXT(NS),
                                                       TEXT("drop_usage"), &drop);
  st->reader = inferway_sse_new(drop);
  return CONTINUE;
}

EXPORT int envoy_dynamic_module_on_http_filter_response_body(envoy_filter e, module_filter m,
                                                             bool end) {
  stream *st = (stream *)m;
  if (st->reader == NULL) return CONTINUE;
  size_t count = envoy_dynamic_module_callback_http_get_body_chunks_size(e, BODY_RECEIVED_RESPONSE);
  envoy_buffer one, *slices = &one;
  if (count > 1) {
    slices = malloc(count * sizeof *slices);
    if (slices == NULL) return CONTINUE;
  }
  if (count > 0 &&
      !envoy_dynamic_module_callback_http_get_body_chunks(e, BODY_RECEIVED_RESPONSE, slices))
    count = 0;
  const char *data = count ? slices[0].ptr : "";
  size_t len = count ? slices[0].length : 0;
  int ok = 1;
  if (count > 1) { /* one contiguous copy of the chunk */
    len = 0;
    for (size_t i = 0; i < count; i++) len += slices[i].length;
    if (len > st->joined_cap) {
      char *grown = realloc(st->joined, len);
      ok = grown != NULL;
      if (ok) st->joined = grown, st->joined_cap = len;
    }
    if (ok) {
      size_t at = 0;
      for (size_t i = 0; i < count; i++) {
        memcpy(st->joined + at, slices[i].ptr, slices[i].length);
        at += slices[i].length;
      }
      data = st->joined;
    }
    free(slices);
  }
  if (ok) {
    const char *out = NULL;
    size_t out_len = 0;
    if (inferway_sse_feed(st->reader, data, len, end, now_us(), &out, &out_len) == 1) {
      /* read everything before changing the chunk: its slices go stale */
      envoy_dynamic_module_callback_http_drain_body(e, BODY_RECEIVED_RESPONSE, len);
      if (out_len)
        envoy_dynamic_module_callback_http_append_body(e, BODY_RECEIVED_RESPONSE,
                                                       (module_buffer){out, out_len});
    }
  }
  if (end) write_counts(e, st);
  return CONTINUE;
}

EXPORT int envoy_dynamic_module_on_http_filter_response_trailers(envoy_filter e, module_filter m) {
  stream *st = (stream *)m;
  if (st->reader != NULL) {
    const char *out = NULL;
    size_t out_len = 0;
    /* the events still held end here; a held partial one has no chunk left to go into */
    inferway_sse_feed(st->reader, "", 0, 1, now_us(), &out, &out_len);
    write_counts(e, st);
  }
  return CONTINUE;
}

EXPORT void envoy_dynamic_module_on_http_filter_stream_complete(envoy_filter e, module_filter m) {
  stream *st = (stream *)m;
  if (st->reader != NULL && !st->written) write_counts(e, st);
}

/* hooks Envoy requires and this filter does not use */
EXPORT void envoy_dynamic_module_on_http_filter_http_callout_done(envoy_filter e, module_filter m,
                                                                  uint64_t id, int result,
                                                                  void *headers, size_t n_headers,
                                                                  void *body, size_t n_body) {
  (void)e, (void)m, (void)id, (void)result, (void)headers, (void)n_headers, (void)body,
      (void)n_body;
}
EXPORT void envoy_dynamic_module_on_http_filter_http_stream_headers(envoy_filter e, module_filter m,
                                                                    uint64_t id, void *headers,
                                                                    size_t n, bool end) {
  (void)e, (void)m, (void)id, (void)headers, (void)n, (void)end;
}
EXPORT void envoy_dynamic_module_on_http_filter_http_stream_data(envoy_filter e, module_filter m,
                                                                 uint64_t id, const void *data,
                                                                 size_t n, bool end) {
  (void)e, (void)m, (void)id, (void)data, (void)n, (void)end;
}
EXPORT void envoy_dynamic_module_on_http_filter_http_stream_trailers(envoy_filter e,
                                                                     module_filter m, uint64_t id,
                                                                     void *trailers, size_t n) {
  (void)e, (void)m, (void)id, (void)trailers, (void)n;
}
EXPORT void envoy_dynamic_module_on_http_filter_http_stream_complete(envoy_filter e,
                                                                     module_filter m, uint64_t id) {
  (void)e, (void)m, (void)id;
}
EXPORT void envoy_dynamic_module_on_http_filter_http_stream_reset(envoy_filter e, module_filter m,
                                                                  uint64_t id, int reason) {
  (void)e, (void)m, (void)id, (void)reason;
}
EXPORT void envoy_dynamic_module_on_http_filter_scheduled(envoy_filter e, module_filter m,
                                                          uint64_t event) {
  (void)e, (void)m, (void)event;
}
EXPORT void envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    envoy_filter e, module_filter m) {
  (void)e, (void)m;
}
EXPORT void envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    envoy_filter e, module_filter m) {
  (void)e, (void)m;
}
