/*
 * A main() for fuzz targets built without libFuzzer: runs
 * LLVMFuzzerTestOneInput once over every file named on the command line
 * (directories: every regular file in them, not recursive). Used by the
 * ctest corpus-replay tests, so that every build (and `make test-asan`)
 * runs the committed seeds and any past crash inputs through the target.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path, long *count)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return 1;
    }
    long n = ftell(f);
    rewind(f);
    if (n < 0) {
        fclose(f);
        return 1;
    }
    /* An exact-size heap copy, so ASan sees any read past the input. */
    uint8_t *buf = malloc(n ? (size_t)n : 1);
    if (!buf || (n && fread(buf, 1, (size_t)n, f) != (size_t)n)) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        free(buf);
        fclose(f);
        return 1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    (*count)++;
    return 0;
}

int main(int argc, char **argv)
{
    long count = 0;
    int bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            bad |= run_file(argv[i], &count);
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (!d) {
            perror(argv[i]);
            return 1;
        }
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            if (stat(path, &st) == 0 && S_ISREG(st.st_mode))
                bad |= run_file(path, &count);
        }
        closedir(d);
    }
    printf("replay: %ld inputs run\n", count);
    if (count == 0) {
        fprintf(stderr, "replay: no inputs found\n");
        return 1;
    }
    return bad;
}
