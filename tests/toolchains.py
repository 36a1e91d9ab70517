"""Small real classifiers exported the standard way of each toolchain, with the toolchain's
own predictions on the eval set (what flipgate's numbers are checked against).

Each builder trains two versions (old, new) on data that ships with a package, exports them
with the toolchain's defaults into `folder`, writes the eval set there and returns a Built.
"""

import contextlib
import inspect
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from sklearn.compose import ColumnTransformer
from sklearn.datasets import load_breast_cancer, load_digits, load_wine
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler
from torch import nn

ECE_BINS = 15


@dataclass(frozen=True)
class Built:
    """Two exported models, the eval set, and each model's own probabilities (or predicted
    classes) on it, in the columns of `classes`."""

    old: Path
    new: Path
    evalset: Path
    labels: np.ndarray  # column indices of the true classes
    old_probs: np.ndarray
    new_probs: np.ndarray
    classes: list[str] | None = None


def expected_counts(built: Built) -> dict:
    """The report's counts and rates, from the toolchains' own predictions with numpy."""
    old_right = built.old_probs.argmax(1) == built.labels
    new_right = built.new_probs.argmax(1) == built.labels
    return {"n": built.labels.size, "er_old": float(np.mean(~old_right)),
            "er_new": float(np.mean(~new_right)),
            "nfr": float(np.mean(old_right & ~new_right)),
            "negative_flips": int(np.sum(old_right & ~new_right)),
            "positive_flips": int(np.sum(~old_right & new_right))}


def ece(probs: np.ndarray, labels: np.ndarray) -> float:
    """Expected calibration error over ECE_BINS equal-width bins of the top probability."""
    confidence = probs.max(1)
    correct = (probs.argmax(1) == labels).astype(float)
    bins = np.minimum(np.maximum(np.ceil(confidence * ECE_BINS) - 1, 0), ECE_BINS - 1)
    return sum(abs(np.sum((correct - confidence)[bins == b])) for b in range(ECE_BINS)) \
        / labels.size


def mean_gap(probs: np.ndarray) -> float:
    """The mean confidence gap: top-1 minus top-2 probability."""
    top = np.sort(probs, axis=1)
    return float(np.mean(top[:, -1] - top[:, -2]))


def sklearn_models(folder: Path) -> Built:
    """A scaled LogisticRegression pipeline (ZipMap, the default) and a RandomForest
    (zipmap=False) on the wine data, via skl2onnx."""
    from skl2onnx import to_onnx

    x, y = load_wine(return_X_y=True)
    x = x.astype(np.float32)
    old = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(x[::2], y[::2])
    new = RandomForestClassifier(n_estimators=15, random_state=0).fit(x[::2], y[::2])
    paths = (folder / "sk_old.onnx", folder / "sk_new.onnx")
    paths[0].write_bytes(to_onnx(old, x[:1]).SerializeToString())
    paths[1].write_bytes(to_onnx(new, x[:1], options={"zipmap": False}).SerializeToString())
    np.savez(evalset := folder / "wine.npz", x=x, y=y)
    return Built(*paths, evalset, y, old.predict_proba(x), new.predict_proba(x))


def string_label_models(folder: Path) -> Built:
    """Two scikit-learn models trained on breast-cancer names ('benign'/'malignant', which
    scikit-learn orders alphabetically: not the order of the data set's integer targets)."""
    from skl2onnx import to_onnx

    data = load_breast_cancer()
    x, names = data.data.astype(np.float32), data.target_names[data.target]
    old = make_pipeline(StandardScaler(), LogisticRegression(C=0.01)).fit(x[::3], names[::3])
    new = RandomForestClassifier(n_estimators=9, random_state=1).fit(x[::3], names[::3])
    paths = (folder / "names_old.onnx", folder / "names_new.onnx")
    for model, path in zip((old, new), paths, strict=True):
        path.write_bytes(to_onnx(model, x[:1]).SerializeToString())
    np.savez(evalset := folder / "cancer.npz", x=x, y=names)
    np.savez(folder / "cancer_targets.npz", x=x, y=data.target)
    labels = np.searchsorted(old.classes_, names)
    return Built(*paths, evalset, labels, old.predict_proba(x), new.predict_proba(x),
                 list(old.classes_))


def dataframe_models(folder: Path) -> Built:
    """ColumnTransformer(StandardScaler, OneHotEncoder) + LogisticRegression over a DataFrame
    of five float columns and one string column: one ONNX input per column."""
    from skl2onnx import to_onnx

    data = load_wine(as_frame=True)
    frame = data.frame.iloc[:, :5].astype(np.float32)  # skl2onnx's ZipMap takes no doubles
    frame["hue_level"] = pd.cut(data.frame["hue"], 3, labels=["low", "mid", "high"]).astype(str)
    floats = list(frame.columns[:5])
    models = []
    for c in (1.0, 0.02):
        encode = ColumnTransformer([("num", StandardScaler(), floats),
                                    ("cat", OneHotEncoder(handle_unknown="ignore"),
                                     ["hue_level"])])
        models.append(make_pipeline(encode, LogisticRegression(C=c, max_iter=1000))
                      .fit(frame, data.target))
    paths = (folder / "frame_old.onnx", folder / "frame_new.onnx")
    for model, path in zip(models, paths, strict=True):
        path.write_bytes(to_onnx(model, frame[:1]).SerializeToString())
    columns = {name: data.frame[name].to_numpy() for name in floats}  # float64: cast losslessly
    columns["hue_level"] = frame["hue_level"].to_numpy().astype(str)
    np.savez(evalset := folder / "wine_frame.npz", y=data.target.to_numpy(), **columns)
    return Built(*paths, evalset, data.target.to_numpy(), models[0].predict_proba(frame),
                 models[1].predict_proba(frame))


def boosted_models(folder: Path) -> Built:
    """LightGBM (old) and XGBoost (new) on the wine data, via onnxmltools."""
    import lightgbm
    import onnxmltools
    import xgboost
    from onnxmltools.convert.common.data_types import FloatTensorType

    x, y = load_wine(return_X_y=True)
    x = x.astype(np.float32)
    old = lightgbm.LGBMClassifier(n_estimators=8, verbose=-1).fit(x[::2], y[::2])
    new = xgboost.XGBClassifier(n_estimators=8, max_depth=3).fit(x[::2], y[::2])
    types = [("input", FloatTensorType([None, x.shape[1]]))]
    paths = (folder / "lgbm.onnx", folder / "xgb.onnx")
    paths[0].write_bytes(onnxmltools.convert_lightgbm(old, initial_types=types)
                         .SerializeToString())
    paths[1].write_bytes(onnxmltools.convert_xgboost(new, initial_types=types)
                         .SerializeToString())
    np.savez(evalset := folder / "wine_boosted.npz", input=x, y=y)
    return Built(*paths, evalset, y, old.predict_proba(x), new.predict_proba(x))


class TwoOutputs(nn.Module):
    """An MLP that returns its logits and its hidden embedding."""

    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(features, 32), nn.ReLU())
        self.head = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        embedding = self.body(x)
        return self.head(embedding), embedding


def fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss, steps: int = 150) -> nn.Module:
    """Full-batch Adam on (x, y); `loss` takes the model's first output and y."""
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(steps):
        optimizer.zero_grad()
        out = model(x)
        loss(out[0] if isinstance(out, tuple) else out, y).backward()
        optimizer.step()
    return model.eval()


def export(model: nn.Module, example: tuple, path: Path, inputs: list[str],
           outputs: list[str]) -> Path:
    """torch.onnx.export with a dynamic batch axis and the weights inside the file."""
    batch = torch.export.Dim("batch")
    with contextlib.redirect_stdout(io.StringIO()):  # the exporter prints its progress
        torch.onnx.export(model, example, str(path), input_names=inputs, output_names=outputs,
                          dynamic_shapes=tuple({0: batch} for _ in example),
                          external_data=False)
    return path


def torch_models(folder: Path) -> Built:
    """A two-output MLP (logits, embedding) and an MLP ending in Softmax on the digits."""
    torch.manual_seed(0)
    x, y = load_digits(return_X_y=True)
    inputs, targets = torch.tensor(x / 16, dtype=torch.float32), torch.tensor(y)
    old = fit(TwoOutputs(64, 10), inputs[::4], targets[::4], nn.functional.cross_entropy, 40)
    softmax = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10), nn.Softmax(-1))
    fit(softmax, inputs[1::4], targets[1::4],
        lambda p, t: nn.functional.nll_loss(torch.log(p + 1e-12), t), 60)
    paths = (export(old, (inputs[:2],), folder / "two_outputs.onnx", ["pixels"],
                    ["logits", "embedding"]),
             export(softmax, (inputs[:2],), folder / "softmax.onnx", ["pixels"], ["probs"]))
    np.savez(evalset := folder / "digits.npz", pixels=x / 16, y=y)
    with torch.no_grad():
        return Built(*paths, evalset, y, torch.softmax(old(inputs)[0], 1).double().numpy(),
                     softmax(inputs).double().numpy())


class Logit(nn.Module):
    """A linear binary classifier that outputs one logit per sample, (N,)."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)[:, 0]


def binary_models(folder: Path) -> Built:
    """A sigmoid classifier (N, 1) in float32 and a float16 one-logit (N,) classifier on the
    standardized breast-cancer data."""
    torch.manual_seed(0)
    x, y = load_breast_cancer(return_X_y=True)
    x = (x - x.mean(0)) / x.std(0)
    inputs, targets = torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)
    sigmoid = fit(nn.Sequential(nn.Linear(30, 1), nn.Sigmoid()), inputs[::5], targets[::5, None],
                  nn.functional.binary_cross_entropy, 30)
    logit = fit(Logit(30), inputs[1::5], targets[1::5],
                nn.functional.binary_cross_entropy_with_logits, 30).half()
    paths = (export(sigmoid, (inputs[:2],), folder / "sigmoid.onnx", ["x"], ["p"]),
             export(logit, (inputs[:2].half(),), folder / "half.onnx", ["x"], ["z"]))
    np.savez(evalset := folder / "cancer_scaled.npz", x=x, y=y)
    with torch.no_grad():
        p_old = sigmoid(inputs)[:, 0].double().numpy()
        p_new = torch.sigmoid(logit(inputs.half()).float()).double().numpy()
    return Built(*paths, evalset, y, np.stack([1 - p_old, p_old], 1),
                 np.stack([1 - p_new, p_new], 1))


def docstring_sentences() -> tuple[list[str], np.ndarray, list[str]]:
    """The docstring lines of three standard-library modules' functions and classes (text
    that ships with Python), each labelled by its module."""
    import json as json_module
    import shutil
    import textwrap

    modules = {"json": json_module, "shutil": shutil, "textwrap": textwrap}
    texts, labels = [], []
    for label, module in enumerate(modules.values()):
        for _, member in inspect.getmembers(module, callable):
            lines = [line.strip() for line in (inspect.getdoc(member) or "").splitlines()]
            texts += [line for line in lines if len(line) > 20]
            labels += [label] * sum(len(line) > 20 for line in lines)
    return texts, np.array(labels), list(modules)


def word_ids(texts: list[str], length: int = 16) -> tuple[np.ndarray, np.ndarray, dict]:
    """Word-level token ids (0: padding, 1: unknown) and the attention mask."""
    words = [re.findall(r"\w+", text.lower())[:length] for text in texts]
    vocab = {word: i + 2 for i, word in enumerate(sorted({w for ws in words for w in ws}))}
    ids = np.zeros((len(texts), length), np.int64)
    for row, ws in enumerate(words):
        ids[row, :len(ws)] = [vocab[w] for w in ws]
    return ids, (ids > 0).astype(np.int64), vocab


class WithTokenTypes(nn.Module):
    """A Hugging Face sequence classifier called with input_ids, attention_mask and (when
    `token_types`) token_type_ids, returning its logits."""

    def __init__(self, model: nn.Module, token_types: bool) -> None:
        super().__init__()
        self.model, self.token_types = model, token_types

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        extra = {"token_type_ids": token_type_ids} if self.token_types else {}
        return self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).logits


def transformers_models(folder: Path) -> Built:
    """Two tiny BERT sequence classifiers built from a config (nothing downloaded), trained
    briefly on standard-library docstrings; the new one also takes token_type_ids."""
    from transformers import BertConfig, BertForSequenceClassification

    texts, y, classes = docstring_sentences()
    ids, mask, vocab = word_ids(texts)
    tokens = torch.tensor(ids), torch.tensor(mask), torch.zeros(ids.shape, dtype=torch.int64)
    wrapped = []
    for seed, token_types in ((0, False), (1, True)):
        torch.manual_seed(seed)
        config = BertConfig(vocab_size=len(vocab) + 2, hidden_size=32, num_hidden_layers=1,
                            num_attention_heads=2, intermediate_size=64, num_labels=3,
                            max_position_embeddings=32)
        model = WithTokenTypes(BertForSequenceClassification(config), token_types)
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        for _ in range(12):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(*tokens), torch.tensor(y)).backward()
            optimizer.step()
        wrapped.append(model.eval())
    names = ["input_ids", "attention_mask", "token_type_ids"]
    paths = [folder / "bert_v1.onnx", folder / "bert_v2.onnx"]
    for model, path, count in zip(wrapped, paths, (2, 3), strict=True):
        torch.onnx.export(model, tuple(t[:2] for t in tokens[:count]), str(path),
                          input_names=names[:count], output_names=["logits"],
                          dynamic_axes={name: {0: "batch"} for name in names[:count]},
                          dynamo=False)
    np.savez(evalset := folder / "docstrings.npz", input_ids=ids, attention_mask=mask,
             token_type_ids=np.zeros_like(ids), y=y, text=np.array(texts), classes=classes)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    with torch.no_grad():
        probs = [torch.softmax(model(*tokens), 1).double().numpy() for model in wrapped]
    return Built(*paths, evalset, y, *probs, classes)
