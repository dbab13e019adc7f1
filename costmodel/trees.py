"""Tree ensembles as plain node arrays, checked like untrusted input and predicted with numpy.

One representation serves both learned tree models: scikit-learn's random forest (the mean of its
trees) and LightGBM's boosted trees (the sum of its trees, with LightGBM's missing-value rules).
A trained model is converted once (`from_sklearn`, `from_lightgbm`); a model file holds the same
arrays (`costmodel.modelfile`), so a trained and a loaded model run the same predictor, and no
file content ever reaches a C parser.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dispatchtune.errors import InputError

#: How a split treats a missing feature value (LightGBM's `missing_type`).
MISSING_NONE, MISSING_ZERO, MISSING_NAN = 0, 1, 2
_MISSING_TYPES = {"None": MISSING_NONE, "Zero": MISSING_ZERO, "NaN": MISSING_NAN}
#: LightGBM's `kZeroThreshold` (a float literal, 1e-35f): |x| at most this counts as zero.
ZERO_THRESHOLD = float(np.float32(1e-35))
#: Deepest tree accepted. Trained trees are far shallower (31 LightGBM leaves: depth <= 30; 256
#: forest leaves: <= 255); the cap bounds the predictor's steps on a crafted file.
MAX_TREE_DEPTH = 4096
#: Largest |leaf value| accepted, so that sums over trees stay finite. (Thresholds may be
#: infinite: LightGBM splits at +inf to send NaN one way; they never enter a prediction's value.)
MAX_MAGNITUDE = 1e100
#: LightGBM objectives whose prediction is the raw sum of the trees (no link function).
IDENTITY_OBJECTIVES = ("regression", "regression_l1", "huber", "fair", "quantile", "mape",
                       "lambdarank", "rank_xendcg")
#: LightGBM's JSON dump writes an infinite threshold as +-1e300 (`Common::AvoidInf`).
_DUMPED_INFINITY = 1e300
#: Working-set size of one prediction step (trees x rows of a chunk), about 32 MB of int64.
_STEP_ELEMENTS = 1 << 22


@dataclass(frozen=True, eq=False)
class TreeArrays:
    """Trees as flat node arrays (all trees concatenated); build with `checked` or `from_*`.

    Node i is a leaf iff ``right[i] == i``; it holds `value[i]`. An internal node sends a row to
    its left child i + 1 if ``x[feature[i]] <= threshold[i]``, else to ``right[i] > i + 1``, except
    for a missing value: NaN counts as 0 unless ``missing_type[i]`` is `MISSING_NAN`, and a value
    that is missing for the split's `missing_type` (zero for `MISSING_ZERO`, NaN for `MISSING_NAN`)
    goes left iff `default_left[i]` (LightGBM's rules; the forests never see missing values).
    `roots[t]` is tree t's root. The prediction is the mean of the trees' leaf values if `average`
    (a random forest), else their sum (boosting). `float32_features` rounds features to float32
    before comparing, as scikit-learn does, so a converted forest reproduces it bit for bit.
    """

    roots: np.ndarray  # int32 (n_trees,)
    right: np.ndarray  # int32 (n_nodes,)
    feature: np.ndarray  # int32 (n_nodes,)
    threshold: np.ndarray  # float64 (n_nodes,)
    value: np.ndarray  # float64 (n_nodes,)
    default_left: np.ndarray  # uint8 (n_nodes,)
    missing_type: np.ndarray  # uint8 (n_nodes,)
    tree_depths: np.ndarray  # int64 (n_trees,): longest root-to-leaf path of each tree
    average: bool
    float32_features: bool

    ARRAYS = ("roots", "right", "feature", "threshold", "value", "default_left", "missing_type")

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def checked(cls, arrays: dict[str, np.ndarray], n_features: int, *, average: bool,
                float32_features: bool) -> TreeArrays:
        """Validate `arrays` (see `ARRAYS`) as trees over n_features features; untrusted input.

        Raises a one-line `InputError` naming the array at fault: lengths differ, a child index
        is out of range or behind its parent, a node has two parents or none (so no cycles and
        no shared subtrees), a feature index is out of range, a value is not finite or too large.
        """
        a = {name: np.asarray(arrays[name]) for name in cls.ARRAYS}
        n = len(a["right"])
        for name in cls.ARRAYS[1:]:
            if len(a[name]) != n:
                raise InputError(f"tree array {name!r} has {len(a[name])} entries, "
                                 f"'right' has {n}")
        roots = a["roots"].astype(np.int64)
        if n == 0 or roots.size == 0:
            raise InputError("tree arrays are empty")
        ids = np.arange(n, dtype=np.int64)
        right = a["right"].astype(np.int64)
        leaf = right == ids
        internal = ~leaf
        if ((right < 0) | (right >= n) | (internal & (right <= ids + 1))).any():
            raise InputError("tree array 'right' has a child out of range or before its parent")
        if ((roots < 0) | (roots >= n)).any():
            raise InputError("tree array 'roots' has a node index out of range")
        # Every node has exactly one parent (or is one root): trees, not graphs.
        refs = np.concatenate([roots, ids[internal] + 1, right[internal]])
        if refs.size != n or (np.bincount(refs, minlength=n) != 1).any():
            raise InputError("tree arrays do not form trees (a node with two parents or none)")
        feature = a["feature"].astype(np.int64)
        if ((feature < 0) | (feature >= n_features)).any():
            raise InputError(f"tree array 'feature' has an index outside 0..{n_features - 1}")
        if np.isnan(a["threshold"].astype(np.float64)).any():
            raise InputError("tree array 'threshold' has a NaN")
        if not (np.abs(a["value"].astype(np.float64)) <= MAX_MAGNITUDE).all():  # false for NaN
            raise InputError(f"tree array 'value' has a value that is not finite or beyond "
                             f"{MAX_MAGNITUDE:g}")
        if not np.isin(a["default_left"], (0, 1)).all():
            raise InputError("tree array 'default_left' has a value other than 0 or 1")
        if not np.isin(a["missing_type"], tuple(_MISSING_TYPES.values())).all():
            raise InputError("tree array 'missing_type' has an unknown missing type")
        return cls(
            roots=roots.astype(np.int32), right=right.astype(np.int32),
            feature=feature.astype(np.int32), threshold=a["threshold"].astype(np.float64),
            value=a["value"].astype(np.float64),
            # A leaf has no split: its split fields are cleared, so a walk can never leave it.
            default_left=np.where(leaf, 0, a["default_left"]).astype(np.uint8),
            missing_type=np.where(leaf, MISSING_NONE, a["missing_type"]).astype(np.uint8),
            tree_depths=_depths(roots, right, internal),
            average=average, float32_features=float32_features,
        )

    @classmethod
    def from_sklearn(cls, forest: Any, n_features: int) -> TreeArrays:
        """A fitted scikit-learn `RandomForestRegressor`, nodes renumbered to preorder."""
        parts: dict[str, list[np.ndarray]] = {k: [] for k in ("r", "f", "t", "v")}
        roots, offset = [], 0
        for estimator in forest.estimators_:
            tree = estimator.tree_
            n = tree.node_count
            order = _preorder(tree.children_left, tree.children_right)
            new_id = np.empty(n, dtype=np.int64)
            new_id[order] = np.arange(n)
            leaf = tree.children_left[order] < 0
            parts["r"].append(np.where(leaf, np.arange(n),
                                       new_id[np.maximum(tree.children_right[order], 0)]) + offset)
            parts["f"].append(np.where(leaf, 0, tree.feature[order]))
            parts["t"].append(np.where(leaf, 0.0, tree.threshold[order]))
            parts["v"].append(tree.value.reshape(n, -1)[order, 0])
            roots.append(offset)
            offset += n
        zeros = np.zeros(offset, dtype=np.uint8)
        arrays = {"roots": np.asarray(roots), "right": np.concatenate(parts["r"]),
                  "feature": np.concatenate(parts["f"]), "threshold": np.concatenate(parts["t"]),
                  "value": np.concatenate(parts["v"]), "default_left": zeros,
                  "missing_type": zeros}
        return cls.checked(arrays, n_features, average=True, float32_features=True)

    @classmethod
    def from_lightgbm(cls, dump: dict[str, Any], n_features: int) -> TreeArrays:
        """A LightGBM booster's `dump_model()` (single output, numerical splits only)."""
        if dump.get("num_class") != 1 or dump.get("num_tree_per_iteration") != 1:
            raise InputError("LightGBM model is not a single-output model")
        objective = str(dump.get("objective", "")).split(" ")[0]
        if objective not in IDENTITY_OBJECTIVES:
            raise InputError(f"LightGBM objective {objective!r} transforms its output; "
                             f"supported: {', '.join(IDENTITY_OBJECTIVES)}")
        columns: dict[str, list[Any]] = {name: [] for name in cls.ARRAYS[1:]}
        roots: list[int] = []
        for tree in dump["tree_info"]:
            if tree.get("num_cat", 0):
                raise InputError("LightGBM model has categorical splits")
            roots.append(len(columns["right"]))
            # Preorder: a node's left child is emitted right after it; its right child's index
            # is patched in when that child is emitted.
            stack: list[tuple[dict[str, Any], int]] = [(tree["tree_structure"], -1)]
            while stack:
                node, parent = stack.pop()
                index = len(columns["right"])
                if parent >= 0:
                    columns["right"][parent] = index
                if "leaf_value" in node:
                    if "leaf_coeff" in node:
                        raise InputError("LightGBM model has linear trees")
                    row = (index, 0, 0.0, node["leaf_value"], 0, MISSING_NONE)
                else:
                    if node["decision_type"] != "<=":
                        raise InputError("LightGBM model has categorical splits")
                    threshold = float(node["threshold"])
                    if abs(threshold) >= _DUMPED_INFINITY:  # the dump writes inf as 1e300
                        threshold = math.copysign(math.inf, threshold)
                    row = (-1, node["split_feature"], threshold, 0.0,
                           int(bool(node["default_left"])), _MISSING_TYPES[node["missing_type"]])
                    stack.append((node["right_child"], index))
                    stack.append((node["left_child"], -1))
                for name, item in zip(cls.ARRAYS[1:], row, strict=True):
                    columns[name].append(item)
        arrays = {"roots": np.asarray(roots, dtype=np.int64),
                  **{name: np.asarray(values) for name, values in columns.items()}}
        return cls.checked(arrays, n_features, average=bool(dump.get("average_output")),
                           float32_features=False)

    # ---- prediction ------------------------------------------------------------------------
    def predict(self, x: np.ndarray, chunk_rows: int = 2048) -> np.ndarray:
        """The ensemble's prediction for each row of `x` (float64, rows x features)."""
        x = np.asarray(x, dtype=np.float64)
        if self.float32_features:
            x = x.astype(np.float32).astype(np.float64)
        trees = len(self.roots)
        # Deepest trees first: step s only walks the trees deeper than s, a prefix of the nodes.
        order = np.argsort(-self.tree_depths, kind="stable")
        walking = trees - np.searchsorted(self.tree_depths[order][::-1], np.arange(self.depth),
                                          side="right")
        roots = self.roots[order].astype(np.intp)
        right = self.right.astype(np.intp)
        # A leaf's threshold is NaN in the walk: `x <= NaN` is false, so a row at a leaf always
        # takes `right[leaf] == leaf` and stays, and an internal node's left child is node + 1.
        threshold = np.where(right == np.arange(len(right)), np.nan, self.threshold)
        feature = self.feature.astype(np.intp)
        special = bool(self.missing_type.any()) or bool(np.isnan(x).any())
        # Chunks keep the (trees x rows) working set in cache and bounded for any tree count.
        chunk_rows = max(1, min(chunk_rows, _STEP_ELEMENTS // trees))
        out = np.empty(len(x))
        for start in range(0, len(x), chunk_rows):
            block = x[start : start + chunk_rows]
            rows = len(block)
            flat = block.T.ravel()  # feature-major: x[r, f] = flat[f * rows + r]
            offset = feature * rows
            row_ids = np.tile(np.arange(rows, dtype=np.intp), trees)
            node = np.repeat(roots, rows)
            for active in walking:
                n = active * rows
                at = node[:n]
                values = flat[offset[at] + row_ids[:n]]
                if special:
                    go_left = self._missing_aware_left(values, at, threshold)
                else:
                    go_left = values <= threshold[at]
                node[:n] = np.where(go_left, at + 1, right[at])
            leaves = np.empty((trees, rows))
            leaves[order] = self.value[node].reshape(trees, rows)
            # Summed tree by tree in the model's order, as LightGBM and scikit-learn accumulate.
            total = leaves.sum(axis=0)
            out[start : start + rows] = total / trees if self.average else total
        return out

    def _missing_aware_left(self, values: np.ndarray, node: np.ndarray,
                            threshold: np.ndarray) -> np.ndarray:
        """Which rows go left at `node`, with LightGBM's missing-value rules (see the class)."""
        kind = self.missing_type[node]
        nan = np.isnan(values)
        values = np.where(nan & (kind != MISSING_NAN), 0.0, values)
        missing = ((kind == MISSING_ZERO) & (np.abs(values) <= ZERO_THRESHOLD)) | (
            (kind == MISSING_NAN) & nan)
        # A leaf (NaN threshold, missing type none) never goes left.
        return np.where(missing, self.default_left[node] == 1, values <= threshold[node])

    # ---- sizes -----------------------------------------------------------------------------
    @property
    def n_trees(self) -> int:
        return len(self.roots)

    @property
    def depth(self) -> int:
        """The longest root-to-leaf path of all trees (the predictor's number of steps)."""
        return int(self.tree_depths.max())


def _depths(roots: np.ndarray, right: np.ndarray, internal: np.ndarray) -> np.ndarray:
    """Each tree's longest root-to-leaf path, level by level (a node is visited once: one parent)."""
    depths = np.zeros(len(roots), dtype=np.int64)
    level, tree = roots, np.arange(len(roots))
    for depth in range(1, MAX_TREE_DEPTH + 2):
        inner = internal[level]
        level, tree = level[inner], tree[inner]
        if level.size == 0:
            return depths
        if depth > MAX_TREE_DEPTH:
            raise InputError(f"trees are deeper than {MAX_TREE_DEPTH} levels")
        depths[tree] = depth
        level, tree = np.concatenate([level + 1, right[level]]), np.concatenate([tree, tree])
    raise AssertionError("unreachable")


def _preorder(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Node ids of one tree in preorder (node, left subtree, right subtree); runs once per fit."""
    order: list[int] = []
    stack = [0]
    while stack:
        node = stack.pop()
        order.append(node)
        if left[node] >= 0:
            stack.append(int(right[node]))
            stack.append(int(left[node]))
    return np.asarray(order, dtype=np.int64)
