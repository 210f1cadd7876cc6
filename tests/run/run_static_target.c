/* A statically linked program: `inprof run` must refuse it in one line (no
   dynamic loader, so no preload library). */
int main(void) { return 0; }
