"""Models whose weights sit beside them (torch.onnx.export's default external data), read
from any working directory, and model .zip archives unpacked only after every check."""

import json

import onnx


def numpy_counts(old_logits, new_logits, y) -> dict:
    old, new = old_logits.argmax(1), new_logits.argmax(1)
    return {"negative_flips": int(((old == y) & (new != y)).sum()),
            "positive_flips": int(((old != y) & (new == y)).sum()),
            "n": int(y.size)}


def test_torch_default_export_writes_external_data(torch_export_pair):
    folder = torch_export_pair.old_onnx.parent
    assert sorted(p.name for p in folder.iterdir()) == ["model.onnx", "model.onnx.data"]


def test_compare_reads_external_data_from_another_working_directory(
        torch_export_pair, run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pair = torch_export_pair
    result = run_cli("compare", pair.old_onnx, pair.new_onnx, "--evalset", pair.evalset_path,
                     "--json", "--device", "cpu")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    expected = numpy_counts(pair.old_logits, pair.new_logits, pair.evalset.y)
    assert {key: report[key] for key in expected} == expected


def test_external_data_outside_the_models_folder_is_still_refused(torch_export_pair, run_cli,
                                                                    tmp_path):
    source = torch_export_pair.old_onnx
    (tmp_path / "model.onnx.data").write_bytes((source.parent / "model.onnx.data").read_bytes())
    (tmp_path / "inner").mkdir()
    model = onnx.load(source, load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            entry.value = "../model.onnx.data" if entry.key == "location" else entry.value
    onnx.save(model, tmp_path / "inner" / "model.onnx")
    inner = tmp_path / "inner"
    result = run_cli("compare", inner / "model.onnx", inner / "model.onnx", "--evalset",
                     torch_export_pair.evalset_path)
    assert result.code != 0 and "external data" in result.err
