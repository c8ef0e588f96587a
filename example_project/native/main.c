/* wc: print the counts of standard input. */
#include <stdio.h>

#include "native/format.h"

int main(void)
{
    static char buf[1 << 16];
    size_t len = fread(buf, 1, sizeof buf, stdin);
    struct wc_counts c;
    char line[WC_FORMAT_MAX];
    wc_count(buf, len, &c);
    wc_format(&c, line, sizeof line);
    puts(line);
    return 0;
}
