#!/usr/bin/env python3
"""Writes the scikit-learn test models in `tests/models/sklearn/`: pipelines fitted on small
seeded data sets, converted by skl2onnx, each with a fixed input and ONNX Runtime's outputs for
it. The models carry the `ai.onnx.ml` operators (LinearClassifier, LinearRegressor, SVM*,
TreeEnsemble*, Scaler, Normalizer, Imputer, OneHotEncoder, ArrayFeatureExtractor, Binarizer,
FeatureVectorizer, ...).

    python3 -m venv /tmp/v && /tmp/v/bin/pip install onnx==1.22.0 onnxruntime==1.31.1 \
        skl2onnx==1.20.0 scikit-learn==1.9.1 pandas numpy
    /tmp/v/bin/python tests/models/make_sklearn.py

Files: `sklearn/<model>.onnx`, `sklearn/<model>.input.<name>.npy`,
`sklearn/<model>.output.<name>.npy`. Classifiers there are converted without their ZipMap (their
probabilities come out as a tensor).

The models with string, sequence and map values (string columns, a text pipeline, DictVectorizer,
classifiers with their default ZipMap output) go to `sklearn-values/<model>/`: `model.onnx`, and
`input/` and `output/` holding each value in the form `epx run` reads and writes (a `.npy` per
tensor, strings as numpy unicode arrays; a `.json` object per map; a folder of items per
sequence).

ONNX Runtime needs an installed locale for StringNormalizer's default `en_US`, and this machine
has only `C.utf8`: the text pipeline's StringNormalizer is given `locale = "C"`. (epx lowers case
by Unicode's rules whatever the locale, except for the Turkic ones, which it refuses.)
"""

import collections
import json
import os
import re
import shutil

import numpy as np
import onnx
import onnxruntime as ort
from skl2onnx import convert_sklearn, to_onnx
from skl2onnx.common.data_types import DictionaryType, FloatTensorType, StringTensorType
from sklearn.feature_extraction import DictVectorizer
from sklearn.feature_extraction.text import TfidfVectorizer
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
VALUES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sklearn-values")
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


def write_value(base, v):
    """A value in the form `epx run` reads: .npy, .json object, or a folder of items."""
    if isinstance(v, dict):
        with open(base + ".json", "w") as f:
            json.dump({str(k): (float(x) if isinstance(x, (float, np.floating)) else x) for k, x in v.items()}, f)
            f.write("\n")
    elif isinstance(v, list):
        os.makedirs(base)
        for i, item in enumerate(v):
            write_value(os.path.join(base, str(i)), item)
    else:
        a = np.asarray(v)
        if a.dtype == object:
            a = a.astype(str)
        np.save(base + ".npy", a)


def save_values(name, onx, feeds):
    """A model with non-tensor values, its inputs and ONNX Runtime's outputs, under VALUES."""
    for n in onx.graph.node:
        if n.op_type == "StringNormalizer":
            n.attribute.append(onnx.helper.make_attribute("locale", "C"))
    root = os.path.join(VALUES, name)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.join(root, "input"))
    os.makedirs(os.path.join(root, "output"))
    onnx.save(onx, os.path.join(root, "model.onnx"))
    sess = ort.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
    outputs = sess.run(None, feeds)
    for k, v in feeds.items():
        write_value(os.path.join(root, "input", safe(k)), v)
    for o, v in zip(sess.get_outputs(), outputs):
        write_value(os.path.join(root, "output", safe(o.name)), v)
    ops = collections.Counter(f"{n.domain or 'ai.onnx'}:{n.op_type}" for n in onx.graph.node)
    print(f"{name}: {dict(ops)}")


def ml_node_model(node, inputs, outputs):
    """A one-node ai.onnx.ml model."""
    g = onnx.helper.make_graph([node], node.op_type, inputs, outputs)
    m = onnx.helper.make_model(
        g, opset_imports=[onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid("ai.onnx.ml", 1)]
    )
    m.ir_version = 9
    return m


def map_models():
    """CastMap and CategoryMapper, which no skl2onnx converter emits, as one-node models."""
    h, T = onnx.helper, onnx.TensorProto
    int_map = h.make_value_info("m", h.make_map_type_proto(T.INT64, h.make_tensor_type_proto(T.FLOAT, None)))
    feeds = {"m": {5: 1.5, 1: 2.5, 3: -1.0}}
    for name, attrs, ty in [
        ("castmap-dense-float", dict(cast_to="TO_FLOAT", map_form="DENSE"), T.FLOAT),
        ("castmap-sparse-int64", dict(cast_to="TO_INT64", map_form="SPARSE", max_map=6), T.INT64),
        ("castmap-dense-string", dict(cast_to="TO_STRING"), T.STRING),
    ]:
        node = h.make_node("CastMap", ["m"], ["y"], domain="ai.onnx.ml", **attrs)
        save_values(name, ml_node_model(node, [int_map], [h.make_tensor_value_info("y", ty, None)]), feeds)
    mapper = dict(domain="ai.onnx.ml", cats_int64s=[1, 2, 3], cats_strings=["a", "b", "c"], default_int64=-7, default_string="none")
    node = h.make_node("CategoryMapper", ["x"], ["y"], **mapper)
    m = ml_node_model(node, [h.make_tensor_value_info("x", T.STRING, None)], [h.make_tensor_value_info("y", T.INT64, None)])
    save_values("category-mapper-to-int", m, {"x": np.array([["a", "z"], ["c", "b"]])})
    node = h.make_node("CategoryMapper", ["x"], ["y"], **mapper)
    m = ml_node_model(node, [h.make_tensor_value_info("x", T.INT64, None)], [h.make_tensor_value_info("y", T.STRING, None)])
    save_values("category-mapper-to-string", m, {"x": np.array([3, 9, 1], dtype=np.int64)})


def value_models(xc, yc):
    opsets = {"": 17, "ai.onnx.ml": 3}
    test = xc[:6]
    # Default conversions: probabilities as a ZipMap (a sequence of maps), int and string labels.
    save_values("logistic-zipmap", to_onnx(LogisticRegression().fit(xc, yc), xc[:1], target_opset=opsets), {"X": test})
    names = np.array(["setosa", "versicolor", "virginica"])[yc]
    forest = RandomForestClassifier(n_estimators=5, max_depth=3, random_state=SEED).fit(xc, names)
    save_values("random-forest-string-labels", to_onnx(forest, xc[:1], target_opset=opsets), {"X": test})

    # A string column one-hot encoded beside scaled numeric columns.
    rng = np.random.default_rng(SEED)
    colors = np.array(["red", "green", "blue", "amber"])[rng.integers(0, 4, size=len(xc))].reshape(-1, 1)
    num = xc[:, :2]
    pipe = make_pipeline(
        ColumnTransformer([("num", StandardScaler(), ["a", "b"]), ("cat", OneHotEncoder(handle_unknown="ignore"), ["color"])]),
        LogisticRegression(),
    )
    import pandas as pd  # column transformers over named columns need a data frame to fit

    df = pd.DataFrame({"a": num[:, 0], "b": num[:, 1], "color": colors[:, 0]})
    pipe.fit(df, yc)
    onx = convert_sklearn(
        pipe,
        initial_types=[("a", FloatTensorType([None, 1])), ("b", FloatTensorType([None, 1])), ("color", StringTensorType([None, 1]))],
        target_opset=opsets,
        options={LogisticRegression: {"zipmap": False}},
    )
    save_values("onehot-string-column", onx, {"a": num[:6, :1], "b": num[:6, 1:2], "color": colors[:6]})

    # A text pipeline: StringNormalizer, com.microsoft Tokenizer, TfIdfVectorizer, a classifier.
    texts = np.array(
        ["the cat sat on the mat", "dogs chase cats", "a bird in the hand", "the dog barks loudly",
         "cats and dogs and birds", "quiet mat for a cat", "Birds sing at dawn", "THE DOG SLEEPS"]
    )
    labels = np.array([0, 1, 0, 1, 1, 0, 0, 1])
    text = make_pipeline(TfidfVectorizer(), LogisticRegression()).fit(np.tile(texts, 4), np.tile(labels, 4))
    onx = convert_sklearn(text, initial_types=[("text", StringTensorType([None]))], target_opset=opsets)
    save_values("tfidf-text", onx, {"text": texts})

    # A map input: DictVectorizer.
    rows = [{"a": 1.0, "b": 2.0}, {"b": 1.0, "c": 3.0}, {"a": 0.5, "c": 1.0}] * 5
    dv = make_pipeline(DictVectorizer(sparse=False), LogisticRegression()).fit(rows, [0, 1, 1] * 5)
    onx = convert_sklearn(dv, initial_types=[("x", DictionaryType(StringTensorType([1]), FloatTensorType([1])))], target_opset=opsets)
    save_values("dict-vectorizer", onx, {"x": {"a": 1.0, "c": 2.0}})
    map_models()


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

    value_models(xc, yc)


if __name__ == "__main__":
    main()
