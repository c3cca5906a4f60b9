/* The pure part of inferway's SSE reader: sse_core.h says what it does. Each check mirrors
 * the Lua pattern of llm_stream.lua it replaces (quoted above it); tests hold the two to the
 * same bytes and counts over any split of a stream (tests/unit/test_llm_sse_reader_core.py). */
#define _GNU_SOURCE
#include "sse_core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NUMBER_MAX 40
#define MODEL_MAX 256
/* An event this long is not one (SSE events are a few hundred bytes): the bytes held are
 * passed on and the reader stops, rather than holding an endless stream in memory. */
#define TAIL_MAX (8u << 20)

struct inferway_sse {
  int drop;
  int failed;
  /* bytes of an event not yet ended, carried to the next chunk */
  char *tail;
  size_t tail_len, tail_cap;
  /* the chunk with the tail before it, when both exist */
  char *joined;
  size_t joined_cap;
  /* what a rewritten chunk becomes */
  char *out;
  size_t out_len, out_cap;
  int64_t chunks, first_us, last_us;
  int done;
  char prompt[NUMBER_MAX + 1], completion[NUMBER_MAX + 1], model[MODEL_MAX + 1];
};

static int reserve(char **buf, size_t *cap, size_t need) {
  if (need <= *cap) return 1;
  size_t size = *cap ? *cap : 256;
  while (size < need) size *= 2;
  char *grown = realloc(*buf, size);
  if (grown == NULL) return 0;
  *buf = grown;
  *cap = size;
  return 1;
}

static int out_add(inferway_sse *s, const char *data, size_t len) {
  if (len == 0) return 1;
  if (!reserve(&s->out, &s->out_cap, s->out_len + len)) return 0;
  memcpy(s->out + s->out_len, data, len);
  s->out_len += len;
  return 1;
}

/* Lua's %s: space, \t, \n, \v, \f, \r */
static int space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

static size_t skip_space(const char *s, size_t n, size_t i) {
  while (i < n && space(s[i])) i++;
  return i;
}

/* the first `lit` in s[from..n), or n */
static size_t find(const char *s, size_t n, const char *lit, size_t from) {
  size_t k = strlen(lit);
  if (from >= n || n - from < k) return n;
  const char *at = memmem(s + from, n - from, lit, k);
  return at == NULL ? n : (size_t)(at - s);
}

/* after `"key"` at i: %s*:%s* then `open`; the index past `open`, or 0 */
static size_t after_colon(const char *s, size_t n, size_t i, char open) {
  i = skip_space(s, n, i);
  if (i >= n || s[i] != ':') return 0;
  i = skip_space(s, n, i + 1);
  if (open == 0) return i;
  if (i >= n || s[i] != open) return 0;
  return i + 1;
}

/* '"key"%s*:%s*"[^"]' from `from` */
static int has_text(const char *s, size_t n, const char *key, size_t from) {
  size_t k = strlen(key);
  for (size_t at = find(s, n, key, from); at < n; at = find(s, n, key, at + 1)) {
    size_t i = after_colon(s, n, at + k, '"');
    if (i && i < n && s[i] != '"') return 1;
  }
  return 0;
}

/* '"key"%s*:%s*%[%s*[^%]%s]' from `from` */
static int has_list(const char *s, size_t n, const char *key, size_t from) {
  size_t k = strlen(key);
  for (size_t at = find(s, n, key, from); at < n; at = find(s, n, key, at + 1)) {
    size_t i = after_colon(s, n, at + k, '[');
    if (!i) continue;
    i = skip_space(s, n, i);
    if (i < n && s[i] != ']') return 1;
  }
  return 0;
}

/* '"key"%s*:%s*(%d+)' from `from`, copied into `into`; 0 when absent */
static int number(const char *s, size_t n, const char *key, size_t from, char *into) {
  size_t k = strlen(key);
  for (size_t at = find(s, n, key, from); at < n; at = find(s, n, key, at + 1)) {
    size_t i = after_colon(s, n, at + k, 0);
    if (!i) continue;
    size_t j = i;
    while (j < n && s[j] >= '0' && s[j] <= '9') j++;
    if (j == i) continue;
    if (j - i > NUMBER_MAX) i = j - NUMBER_MAX; /* absurd; keeps its last digits */
    memcpy(into, s + i, j - i);
    into[j - i] = 0;
    return 1;
  }
  return 0;
}

/* '^%s*data:%s*%[DONE%]' or '\ndata:%s*%[DONE%]' */
static int is_done(const char *e, size_t n) {
  if (find(e, n, "[DONE]", 0) == n) return 0;
  size_t i = skip_space(e, n, 0);
  for (;;) {
    if (n - i >= 5 && memcmp(e + i, "data:", 5) == 0) {
      size_t j = skip_space(e, n, i + 5);
      if (n - j >= 6 && memcmp(e + j, "[DONE]", 6) == 0) return 1;
    }
    size_t at = find(e, n, "\ndata:", i);
    if (at == n) return 0;
    i = at + 1;
  }
}

/* '"model"%s*:%s*"([^"\\]*)"': the first full match, its capture when not empty */
static void read_model(inferway_sse *s, const char *e, size_t n) {
  for (size_t at = find(e, n, "\"model\"", 0); at < n; at = find(e, n, "\"model\"", at + 1)) {
    size_t i = after_colon(e, n, at + 7, '"');
    if (!i) continue;
    size_t j = i;
    while (j < n && e[j] != '"' && e[j] != '\\') j++;
    if (j >= n || e[j] != '"') continue;
    if (j > i) {
      size_t len = j - i > MODEL_MAX ? MODEL_MAX : j - i;
      for (size_t c = 0; c < len; c++) /* the report is JSON: no control bytes */
        if ((unsigned char)e[i + c] < 0x20) return;
      memcpy(s->model, e + i, len);
      s->model[len] = 0;
    }
    return;
  }
}

/* One whole event: what it counts. Returns 1 when it is the usage-only event. */
static int account(inferway_sse *s, const char *e, size_t n, int64_t now_us) {
  if (is_done(e, n)) {
    s->done = 1;
    return 0;
  }
  if (find(e, n, "data", 0) == n) return 0;
  if (s->model[0] == 0) read_model(s, e, n);
  int usage_only = 0;
  for (size_t at = find(e, n, "\"usage\"", 0); at < n; at = find(e, n, "\"usage\"", at + 1)) {
    if (!after_colon(e, n, at + 7, '{')) continue;
    char prompt[NUMBER_MAX + 1];
    if (number(e, n, "\"prompt_tokens\"", at, prompt)) {
      memcpy(s->prompt, prompt, sizeof prompt);
      if (!number(e, n, "\"completion_tokens\"", at, s->completion)) strcpy(s->completion, "0");
      usage_only = !has_list(e, n, "\"choices\"", 0);
    }
    break;
  }
  if (has_text(e, n, "\"content\"", 0) || has_text(e, n, "\"text\"", 0) ||
      has_list(e, n, "\"tool_calls\"", 0)) {
    s->chunks++;
    if (s->first_us == 0) s->first_us = now_us;
    s->last_us = now_us;
  }
  return usage_only;
}

/* where the next event ends in d[from..n): its separator's start and end; 0 when none */
static int boundary(const char *d, size_t n, size_t from, int lf_only, size_t *a, size_t *b) {
  if (lf_only) {
    size_t at = find(d, n, "\n\n", from);
    if (at == n) return 0;
    *a = at;
    *b = at + 2;
    return 1;
  }
  for (size_t i = from; i + 1 < n; i++) {
    if (d[i] == '\n' && d[i + 1] == '\n') {
      *a = i, *b = i + 2;
      return 1;
    }
    if (d[i] == '\r') {
      if (d[i + 1] == '\r') {
        *a = i, *b = i + 2;
        return 1;
      }
      if (i + 3 < n && d[i + 1] == '\n' && d[i + 2] == '\r' && d[i + 3] == '\n') {
        *a = i, *b = i + 4;
        return 1;
      }
    }
  }
  return 0;
}

inferway_sse *inferway_sse_new(int drop) {
  inferway_sse *s = calloc(1, sizeof *s);
  if (s != NULL) s->drop = drop != 0;
  return s;
}

void inferway_sse_free(inferway_sse *s) {
  if (s == NULL) return;
  free(s->tail);
  free(s->joined);
  free(s->out);
  free(s);
}

int inferway_sse_feed(inferway_sse *s, const char *chunk, size_t len, int end, int64_t now_us,
                      const char **out, size_t *out_len) {
  if (s->failed) return 0;
  const char *d = chunk;
  size_t n = len;
  int carried = s->tail_len > 0;
  if (carried) {
    if (!reserve(&s->joined, &s->joined_cap, s->tail_len + len)) goto oom;
    memcpy(s->joined, s->tail, s->tail_len);
    if (len) memcpy(s->joined + s->tail_len, chunk, len);
    d = s->joined;
    n = s->tail_len + len;
  }
  int lf_only = memchr(d, '\r', n) == NULL;
  int dropped = 0;
  s->out_len = 0;
  size_t pos = 0, a, b;
  while (boundary(d, n, pos, lf_only, &a, &b)) {
    int usage_only = account(s, d + pos, b - pos, now_us);
    if (usage_only && s->drop) {
      dropped = 1;
    } else if (s->drop && !out_add(s, d + pos, b - pos)) {
      goto oom;
    }
    pos = b;
  }
  /* the rest: an event not ended yet */
  if (!reserve(&s->tail, &s->tail_cap, n - pos + 1)) goto oom;
  memmove(s->tail, d + pos, n - pos);
  s->tail_len = n - pos;
  int rewrite = s->drop && (dropped || carried || s->tail_len > 0);
  if (s->tail_len > TAIL_MAX) {
    if (s->drop && !out_add(s, s->tail, s->tail_len)) goto oom;
    s->tail_len = 0;
    s->failed = 1;
  }
  if (end && s->tail_len > 0) {
    int blank = 1;
    for (size_t i = 0; i < s->tail_len; i++) blank = blank && space(s->tail[i]);
    int drop_tail = !blank && account(s, s->tail, s->tail_len, now_us) && s->drop;
    if (s->drop && !drop_tail) {
      if (!rewrite && !out_add(s, d, pos)) goto oom; /* the whole events, as received */
      if (!out_add(s, s->tail, s->tail_len)) goto oom;
      rewrite = 1;
    }
    s->tail_len = 0;
  }
  if (!rewrite) return 0;
  *out = s->out_len ? s->out : "";
  *out_len = s->out_len;
  return 1;
oom:
  s->failed = 1;
  s->tail_len = 0;
  return -1;
}

int64_t inferway_sse_chunks(const inferway_sse *s) { return s->chunks; }
int64_t inferway_sse_first_us(const inferway_sse *s) { return s->first_us; }
int64_t inferway_sse_last_us(const inferway_sse *s) { return s->last_us; }
const char *inferway_sse_prompt(const inferway_sse *s) { return s->prompt; }
const char *inferway_sse_completion(const inferway_sse *s) { return s->completion; }
const char *inferway_sse_model(const inferway_sse *s) { return s->model; }
int inferway_sse_done(const inferway_sse *s) { return s->done; }
int inferway_sse_failed(const inferway_sse *s) { return s->failed; }
