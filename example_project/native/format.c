#include <stdio.h>

#include "native/format.h"

int wc_format(const struct wc_counts *c, char *out, size_t size)
{
    return snprintf(out, size, "%zu lines, %zu words, %zu bytes", c->lines, c->words, c->bytes);
}
