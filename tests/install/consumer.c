/* An application outside the tree: built against an installed Strata, once through
   find_package(strata) and once through pkg-config. It checks the version and that a bad
   model path is a clear error, not a crash. */
#include <stdio.h>
#include <string.h>

#include <strata/strata.h>

int main(void) {
  strata_model* model = NULL;
  const char* version = strata_version();
  if (version == NULL || version[0] == '\0') {
    fprintf(stderr, "consumer: empty version\n");
    return 1;
  }
  if (strata_model_load("/nonexistent/model.gguf", &model) == STRATA_OK || model != NULL) {
    fprintf(stderr, "consumer: loading a missing file succeeded\n");
    return 1;
  }
  if (strstr(strata_last_error(), "/nonexistent/model.gguf") == NULL) {
    fprintf(stderr, "consumer: error does not name the file: %s\n", strata_last_error());
    return 1;
  }
  printf("consumer: strata %s, error: %s\n", version, strata_last_error());
  return 0;
}
