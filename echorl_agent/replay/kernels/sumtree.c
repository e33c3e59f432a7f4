/* Batched sum-tree descent and leaf update for echorl_agent/replay/sumtree.py (the numpy code there is the
 * reference; these loops compute bit-identical results, one sample or one leaf at a time instead of one tree
 * level at a time, which at batch 256 and depth 20 saves ~20 numpy calls per operation).
 *
 * Layout (as SumTree): tree[1] is the root, node i has children 2i and 2i + 1, leaves are tree[cap:2cap].
 * Loaded by echorl_agent/replay/ckernel.py (compiled on first use with the machine's C compiler).
 */
#include <stdint.h>

/* For each mass u[k] in [0, total): the leaf i with prefix(i) <= u[k] < prefix(i + 1) (0-based), written to out[k].
 * Same arithmetic as SumTree.find: at each level go right iff u >= left child, subtracting the left mass. */
void sumtree_find(const double *tree, int64_t depth, const double *u, int64_t n, int64_t *out) {
    const int64_t cap = (int64_t)1 << depth;
    for (int64_t k = 0; k < n; k++) {
        double m = u[k];
        int64_t idx = 1;
        for (int64_t level = 0; level < depth; level++) {
            const int64_t left = idx << 1;
            const double lv = tree[left];
            if (m >= lv) {
                m -= lv;
                idx = left + 1;
            } else {
                idx = left;
            }
        }
        out[k] = idx - cap;
    }
}

/* Set leaves idx[k] = values[k] (k in order: a repeated leaf keeps its last value), then recompute every ancestor
 * as the sum of its two children. An ancestor shared by several leaves is recomputed on each of their walks; its
 * last recomputation happens after all of its subtree's leaves are set, so every node ends equal to
 * tree[2i] + tree[2i + 1] exactly as SumTree.set and SumTree.rebuild leave it. */
void sumtree_set(double *tree, int64_t cap, const int64_t *idx, const double *values, int64_t n) {
    for (int64_t k = 0; k < n; k++) tree[cap + idx[k]] = values[k];
    for (int64_t k = 0; k < n; k++) {
        int64_t node = (cap + idx[k]) >> 1;
        while (node >= 1) {
            tree[node] = tree[2 * node] + tree[2 * node + 1];
            node >>= 1;
        }
    }
}
