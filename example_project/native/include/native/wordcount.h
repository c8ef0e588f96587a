/* wordcount: count words, lines and bytes of a buffer (a tiny C library). */
#ifndef NATIVE_WORDCOUNT_H
#define NATIVE_WORDCOUNT_H

#include <stddef.h>

struct wc_counts {
    size_t bytes;
    size_t words;
    size_t lines;
};

void wc_count(const char *buf, size_t len, struct wc_counts *out);

#endif
