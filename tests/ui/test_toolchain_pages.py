"""The dashboard's pair page for a real scikit-learn export trained on class names: the
gallery names the classes and shows each flipped sample's feature values."""

import re

import numpy as np

from tests import toolchains
from tests.service.api.conftest import measure


def test_the_gallery_names_classes_and_shows_feature_values(client, mint, toolchain_folder,
                                                            tmp_path):
    built = toolchains.string_label_models(toolchain_folder)
    with np.load(built.evalset) as data:
        x, names = data["x"], data["y"]
    np.savez(evalset := tmp_path / "named.npz", x=x, y=names, classes=np.array(built.classes))
    for version, path in (("1", built.old), ("2", built.new)):
        assert client.post("/models", data={"name": "cancer", "version": version},
                           files={"artifact": ("m.onnx", path.read_bytes())}).is_success
    assert client.post("/evalsets", data={"name": "eval"},
                       files={"data": ("e.npz", evalset.read_bytes())}).is_success
    flips = measure(client, "cancer:1", "cancer:2", "eval")["flipped_indices"]["negative"]
    token = mint("read")
    client.headers.pop("Authorization")  # from here on, a browser
    assert client.post("/ui/signin", data={"token": token}).is_success
    text = client.get("/ui/lines/cancer/pairs/1/2?evalset=eval").text
    rows = re.findall(r'data-index="(\d+)"><td>#\d+</td><td>(\w+)</td><td>(\w+) \(', text)
    assert sorted(int(index) for index, _, _ in rows) == sorted(flips)[:48] and rows
    for index, label, old in rows:
        assert label == old == names[int(index)]
        assert f"[{x[int(index), 0]:.3g}, {x[int(index), 1]:.3g}," in text
