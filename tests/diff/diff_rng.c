/* splitmix64: small, fast and the same everywhere, so a seed replays. */
#include "diff.h"

uint64_t rng_next(rng *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t rng_below(rng *r, uint64_t n) { return rng_next(r) % n; }

int64_t rng_range(rng *r, int64_t lo, int64_t hi) {
  return lo + (int64_t)rng_below(r, (uint64_t)(hi - lo) + 1);
}

double rng_unit(rng *r) { return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }

int rng_chance(rng *r, double p) { return rng_unit(r) < p; }

rng rng_for(uint64_t seed, uint64_t tag) {
  rng r = {seed * 0x2545f4914f6cdd1dull ^ (tag + 0x632be59bd9b4e019ull)};
  rng_next(&r);
  return r;
}
