/* format: render counts as one line of text. */
#ifndef NATIVE_FORMAT_H
#define NATIVE_FORMAT_H

#include "native/wordcount.h"

#define WC_FORMAT_MAX 96

int wc_format(const struct wc_counts *c, char *out, size_t size);

#endif
