#!/usr/bin/env python3
"""Writes the scikit-learn test models in `tests/models/sklearn/`: pipelines fitted on small
seeded data sets, converted by skl2onnx, each with a fixed input and ONNX Runtime's outputs for
it. The models carry the `ai.onnx.ml` operators (LinearClassifier, LinearRegressor, SVM*,
TreeEnsemble*, Scaler, Normalizer, Imputer, OneHotEncoder, ArrayFeatureExtractor, Binarizer,
FeatureVectorizer, ...).

    python3 -m venv /tmp/v && /tmp/v/bin/pip install onnx==1.22.0 onnxruntime==1.31.1 \
        skl2onnx==1.20.0 scikit-learn==1.9.1 numpy
    /tmp/v/bin/python tests/models/make_sklearn.py

Files: `sklearn/<model>.onnx`, `sklearn/<model>.input.<name>.npy`,
`sklearn/<model>.output.<name>.npy`. Classifiers are converted without their ZipMap (their
probabilities come out as a tensor).
"""

import collections
import os
import re

import numpy as np
import onnx
import onnxruntime as ort
from skl2onnx import to_onnx
from sklearn.compose import ColumnTransformer
from sklearn.datasets import make_classification, make_regression
from sklearn.decomposition import PCA
from sklearn.ensemble import (
    GradientBoostingClassifier,
    GradientBoostingRegressor,
    HistGradientBoostingClassifier,
    HistGradientBoostingRegressor,
    RandomForestClassifier,
    RandomForestRegressor,
)
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LinearRegression, LogisticRegression, Ridge
from sklearn.neighbors import KNeighborsClassifier, KNeighborsRegressor
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import (
    Binarizer,
    MaxAbsScaler,
    MinMaxScaler,
    Normalizer,
    OneHotEncoder,
    StandardScaler,
)
from sklearn.svm import SVC, SVR, LinearSVC
from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sklearn")
SEED = 20261201
OPSETS = {"": 17, "ai.onnx.ml": 3}


# skl2onnx 1.20 hands scikit-learn 1.9's boolean missing-value masks of histogram gradient
# boosting to onnx as numpy bools, which `make_attribute` refuses: write them as the 0/1
# integers the attribute holds.
_make_attribute = onnx.helper.make_attribute


def _make_attribute_with_bools(key, value, *args, **kwargs):
    if isinstance(value, (list, tuple, np.ndarray)) and any(
        isinstance(v, (bool, np.bool_)) for v in value
    ):
        value = [int(v) for v in value]
    return _make_attribute(key, value, *args, **kwargs)


onnx.helper.make_attribute = _make_attribute_with_bools


def safe(name):
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def save(name, model, x, options=None):
    onx = to_onnx(model, x[:1], target_opset=OPSETS, options=options)
    path = os.path.join(HERE, f"{name}.onnx")
    onnx.save(onx, path)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {sess.get_inputs()[0].name: x}
    outputs = sess.run(None, feeds)
    for k, v in feeds.items():
        np.save(os.path.join(HERE, f"{name}.input.{safe(k)}.npy"), v)
    for o, v in zip(sess.get_outputs(), outputs):
        np.save(os.path.join(HERE, f"{name}.output.{safe(o.name)}.npy"), np.asarray(v))
    ops = collections.Counter(f"{n.domain or 'ai.onnx'}:{n.op_type}" for n in onx.graph.node)
    print(f"{name}: {dict(ops)}")


def main():
    os.makedirs(HERE, exist_ok=True)
    nozip = {"zipmap": False}
    xc, yc = make_classification(
        n_samples=200, n_features=6, n_informative=4, n_classes=3, random_state=SEED
    )
    xb, yb = make_classification(n_samples=200, n_features=6, random_state=SEED + 1)
    xr, yr = make_regression(n_samples=200, n_features=6, noise=0.5, random_state=SEED)
    xc, xb, xr = (a.astype(np.float32) for a in (xc, xb, xr))
    test_c, test_b, test_r = xc[:16], xb[:16], xr[:16]

    save("linear-regression", LinearRegression().fit(xr, yr), test_r)
    save("ridge-two-targets", Ridge().fit(xr, np.c_[yr, -yr]), test_r)
    save("logistic-binary", LogisticRegression().fit(xb, yb), test_b, {LogisticRegression: nozip})
    save("logistic-multiclass", LogisticRegression().fit(xc, yc), test_c, {LogisticRegression: nozip})
    save("linear-svc-binary", LinearSVC().fit(xb, yb), test_b)
    save("decision-tree-classifier", DecisionTreeClassifier(max_depth=5, random_state=SEED).fit(xc, yc), test_c, {DecisionTreeClassifier: nozip})
    save("decision-tree-regressor", DecisionTreeRegressor(max_depth=5, random_state=SEED).fit(xr, yr), test_r)
    save("random-forest-binary", RandomForestClassifier(n_estimators=10, max_depth=4, random_state=SEED).fit(xb, yb), test_b, {RandomForestClassifier: nozip})
    save("random-forest-multiclass", RandomForestClassifier(n_estimators=10, max_depth=4, random_state=SEED).fit(xc, yc), test_c, {RandomForestClassifier: nozip})
    save("random-forest-regressor", RandomForestRegressor(n_estimators=10, max_depth=4, random_state=SEED).fit(xr, yr), test_r)
    save("gradient-boosting-binary", GradientBoostingClassifier(n_estimators=10, random_state=SEED).fit(xb, yb), test_b, {GradientBoostingClassifier: nozip})
    save("gradient-boosting-multiclass", GradientBoostingClassifier(n_estimators=10, random_state=SEED).fit(xc, yc), test_c, {GradientBoostingClassifier: nozip})
    save("gradient-boosting-regressor", GradientBoostingRegressor(n_estimators=10, random_state=SEED).fit(xr, yr), test_r)
    hgb = dict(max_iter=10, random_state=SEED)
    save("hist-gradient-boosting-binary", HistGradientBoostingClassifier(**hgb).fit(xb, yb), test_b, {HistGradientBoostingClassifier: nozip})
    save("hist-gradient-boosting-multiclass", HistGradientBoostingClassifier(**hgb).fit(xc, yc), test_c, {HistGradientBoostingClassifier: nozip})
    save("hist-gradient-boosting-regressor", HistGradientBoostingRegressor(**hgb).fit(xr, yr), test_r)
    save("svc-rbf-multiclass", SVC(probability=True, random_state=SEED).fit(xc, yc), test_c, {SVC: nozip})
    save("svc-linear-binary", SVC(kernel="linear").fit(xb, yb), test_b, {SVC: nozip})
    save("svc-poly-binary-proba", SVC(kernel="poly", degree=2, probability=True, random_state=SEED).fit(xb, yb), test_b, {SVC: nozip})
    save("svr-rbf", SVR().fit(xr, yr / 100), test_r)
    save("scaler-pca", make_pipeline(StandardScaler(), PCA(n_components=3, random_state=SEED)).fit(xr), test_r)
    save("minmax-maxabs-normalizer", make_pipeline(MinMaxScaler(), MaxAbsScaler(), Normalizer(norm="l1")).fit(xr), test_r)
    save("binarizer", Binarizer(threshold=0.1).fit(xr), test_r)
    save("knn-classifier", KNeighborsClassifier(n_neighbors=3).fit(xc, yc), test_c, {KNeighborsClassifier: nozip})
    save("knn-regressor", KNeighborsRegressor(n_neighbors=4).fit(xr, yr), test_r)
    save("mlp-classifier", MLPClassifier(hidden_layer_sizes=(8,), max_iter=300, random_state=SEED).fit(xc, yc), test_c, {MLPClassifier: nozip})
    save("mlp-regressor", MLPRegressor(hidden_layer_sizes=(8,), max_iter=300, random_state=SEED).fit(xr, yr / 100), test_r)

    # Numeric columns with holes, imputed, and an integer-coded column one-hot encoded.
    rng = np.random.default_rng(SEED)
    num = xr[:, :3].copy()
    num[rng.random(num.shape) < 0.15] = np.nan
    cat = rng.integers(0, 4, size=(len(xr), 1)).astype(np.float32)
    mixed = np.c_[num, cat].astype(np.float32)
    columns = ColumnTransformer(
        [
            ("num", make_pipeline(SimpleImputer(strategy="mean"), StandardScaler()), [0, 1, 2]),
            ("cat", OneHotEncoder(handle_unknown="ignore"), [3]),
        ]
    )
    save("impute-onehot-logistic", make_pipeline(columns, LogisticRegression()).fit(mixed, yc), mixed[:16], {LogisticRegression: nozip})


if __name__ == "__main__":
    main()
