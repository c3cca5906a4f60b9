/* The part of Envoy's dynamic-module C ABI (HTTP filters) that sse_filter.c uses, declared
 * here from Envoy 1.40's interface: the ABI version "v0.2.0", the hooks a module must export,
 * and the callbacks Envoy exports to it. Envoy loads lib<name>.so from
 * ENVOY_DYNAMIC_MODULES_SEARCH_PATH (inferway/xds/sse_module_build.py). */
#ifndef INFERWAY_ENVOY_ABI_H
#define INFERWAY_ENVOY_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define INFERWAY_ENVOY_ABI_VERSION "v0.2.0"

typedef struct {
  const char *ptr;
  size_t length;
} envoy_buffer; /* Envoy's bytes, valid until the hook returns */

typedef struct {
  const char *ptr;
  size_t length;
} module_buffer; /* the module's bytes, passed by value */

typedef struct {
  const char *key_ptr;
  size_t key_length;
  const char *value_ptr;
  size_t value_length;
} envoy_header;

typedef void *envoy_filter; /* Envoy's side of one stream's filter */
typedef const void *module_filter;
typedef const void *module_config;

enum { HEADER_REQUEST = 0, HEADER_RESPONSE = 2 };
enum { BODY_RECEIVED_RESPONSE = 2 };
enum { METADATA_DYNAMIC = 0 };
enum { CONTINUE = 0 }; /* every hook's "go on" status */

/* callbacks Envoy exports */
bool envoy_dynamic_module_callback_http_get_header(envoy_filter e, int header_type,
                                                   module_buffer key, envoy_buffer *result,
                                                   size_t index, size_t *optional_size);
bool envoy_dynamic_module_callback_http_set_header(envoy_filter e, int header_type,
                                                   module_buffer key, module_buffer value);
size_t envoy_dynamic_module_callback_http_get_body_chunks_size(envoy_filter e, int body_type);
bool envoy_dynamic_module_callback_http_get_body_chunks(envoy_filter e, int body_type,
                                                        envoy_buffer *result);
bool envoy_dynamic_module_callback_http_drain_body(envoy_filter e, int body_type, size_t bytes);
bool envoy_dynamic_module_callback_http_append_body(envoy_filter e, int body_type,
                                                    module_buffer data);
void envoy_dynamic_module_callback_http_set_dynamic_metadata_number(envoy_filter e,
                                                                    module_buffer ns,
                                                                    module_buffer key,
                                                                    double value);
void envoy_dynamic_module_callback_http_set_dynamic_metadata_string(envoy_filter e,
                                                                    module_buffer ns,
                                                                    module_buffer key,
                                                                    module_buffer value);
void envoy_dynamic_module_callback_http_set_dynamic_metadata_bool(envoy_filter e,
                                                                  module_buffer ns,
                                                                  module_buffer key, bool value);
bool envoy_dynamic_module_callback_http_get_metadata_string(envoy_filter e, int source,
                                                            module_buffer ns, module_buffer key,
                                                            envoy_buffer *result);
bool envoy_dynamic_module_callback_http_get_metadata_bool(envoy_filter e, int source,
                                                          module_buffer ns, module_buffer key,
                                                          bool *result);

#endif
