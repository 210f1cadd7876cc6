/* Source of the symbolizer seeds (fuzz/seeds/make_seeds.sh). */
static int helper(int x) { return x * 3 + 1; }
static inline __attribute__((always_inline)) int inlined(int x) {
  return helper(x) ^ 5;
}
int tiny_entry(int x) { return inlined(x) + 2; }
