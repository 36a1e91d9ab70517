"""`flipgate traffic import` on capture files written in each format's documented shape:
SageMaker Data Capture JSON lines (CSV, JSON and BASE64 payloads) and KServe payload-logger
CloudEvents (V1 and V2 payloads); unpaired and malformed records are counted, and the
result is a traffic set that `flipgate compare` reads."""

import base64
import json

import numpy as np

from flipgate.scores import PROBABILITY_FLOOR

RNG = np.random.default_rng(0)
INPUTS = RNG.normal(size=(6, 4)).round(3)
OLD_P = RNG.dirichlet(np.ones(3), size=6).round(4)
NEW_P = np.roll(OLD_P, 1, axis=1)  # every prediction moves one class on


def csv_line(values) -> str:
    return ",".join(str(v) for v in values)


def sagemaker_record(request_id: str, sent, answered, encoding: str = "CSV") -> str:
    """One Data Capture line as SageMaker writes it (docs: 'Capture data from real-time
    endpoint'), with the caller's inference id."""
    def part(mode: str, values) -> dict:
        if encoding == "JSON":
            data = json.dumps({"instances" if mode == "INPUT" else "predictions": [values]})
            kind = "application/json"
        else:
            data, kind = csv_line(values), "text/csv"
            if encoding == "BASE64":
                data = base64.b64encode(data.encode()).decode()
        return {"observedContentType": kind, "mode": mode, "data": data, "encoding": encoding}

    return json.dumps({"captureData": {"endpointInput": part("INPUT", sent),
                                       "endpointOutput": part("OUTPUT", answered)},
                       "eventMetadata": {"eventId": f"event-{request_id}",
                                         "inferenceId": request_id,
                                         "inferenceTime": "2026-11-27T08:00:00Z"},
                       "eventVersion": "0"})


def write_sagemaker(path, probabilities, skip=(), extra=(), reverse=False) -> None:
    encodings = ["CSV", "JSON", "BASE64", "CSV", "JSON", "CSV"]
    lines = [sagemaker_record(f"req-{i}", INPUTS[i].tolist(), probabilities[i].tolist(),
                              encodings[i]) for i in range(6) if i not in skip]
    path.write_text("\n".join([*(lines[::-1] if reverse else lines), *extra]) + "\n")


def test_sagemaker_capture_of_two_variants(run_cli, tmp_path):
    write_sagemaker(tmp_path / "old.jsonl", OLD_P,
                    extra=['{"captureData": {}}', "not json"])
    write_sagemaker(tmp_path / "new.jsonl", NEW_P, skip=(2,), reverse=True)
    result = run_cli("traffic", "import", "--format", "sagemaker", "--old",
                     tmp_path / "old.jsonl", "--new", tmp_path / "new.jsonl", "--out",
                     tmp_path / "out", "--classes", "a,b,c", "--json")
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert summary["samples"] == 5 and summary["unpaired"]["old_only"] == 1
    assert summary["malformed"]["old"] == {"not_a_capture_record": 1, "not_json": 1}
    assert "old.jsonl:8: not_json" in " ".join(summary["problems"])
    assert "not paired or not readable" in result.err
    paired = [0, 1, 3, 4, 5]  # the new variant's capture lacks req-2 and is in another order
    with np.load(tmp_path / "out" / "traffic.npz") as traffic:
        assert traffic["ids"].tolist() == [f"req-{i}" for i in paired]
        assert np.allclose(traffic["x"], INPUTS[paired])
    for side, probabilities in (("old", OLD_P), ("new", NEW_P)):
        logits = np.load(tmp_path / "out" / f"{side}.npy")
        assert np.allclose(np.exp(logits), np.maximum(probabilities[paired], PROBABILITY_FLOOR),
                           rtol=1e-5)
    compared = run_cli("compare", tmp_path / "out" / "old.npy", tmp_path / "out" / "new.npy",
                       "--evalset", tmp_path / "out" / "traffic.npz", "--json")
    report = json.loads(compared.out)
    assert report["churn"] == np.mean(OLD_P[paired].argmax(1) != NEW_P[paired].argmax(1))
    assert {row["old_name"] for row in report["changes"]} <= {"a", "b", "c"}


def cloudevent(kind: str, event_id: str, data: dict, **extensions) -> str:
    """A structured-mode CloudEvent as KServe's payload logger sends it."""
    return json.dumps({"specversion": "1.0", "id": event_id, "source": "http://localhost:9081/",
                       "type": f"org.kubeflow.serving.inference.{kind}",
                       "datacontenttype": "application/json", "data": data,
                       "inferenceservicename": "digits", "namespace": "default",
                       "component": "predictor", "endpoint": "default", **extensions})


def write_kserve(path, labels, v2: bool, extra=()) -> None:
    events = []
    for i, label in enumerate(labels):
        if v2:
            sent = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP64",
                                "data": INPUTS[i].tolist()}]}
            answered = {"outputs": [{"name": "label", "shape": [1], "datatype": "INT64",
                                     "data": [int(label)]}]}
        else:
            sent, answered = {"instances": [INPUTS[i].tolist()]}, {"predictions": [int(label)]}
        events += [cloudevent("request", f"id-{i}", sent), cloudevent("response", f"id-{i}",
                                                                      answered)]
    path.write_text("\n".join([*events, *extra]) + "\n")


def test_kserve_payload_logger_events_of_two_services(run_cli, tmp_path):
    old_labels, new_labels = np.array([0, 1, 2, 0, 1, 2]), np.array([0, 2, 2, 1, 1, 2])
    write_kserve(tmp_path / "old.jsonl", old_labels, v2=False,
                 extra=[cloudevent("response", "id-orphan", {"predictions": [1]}),
                        cloudevent("request", "id-bad", {"nothing": []})])
    write_kserve(tmp_path / "new.jsonl", new_labels, v2=True)
    result = run_cli("traffic", "import", "--format", "kserve", "--old", tmp_path / "old.jsonl",
                     "--new", tmp_path / "new.jsonl", "--out", tmp_path / "out", "--json")
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert summary["samples"] == 6 and summary["unpaired"]["old_events"] == 1
    assert summary["malformed"]["old"] == {"input_missing": 1}
    assert np.load(tmp_path / "out" / "new.npy").tolist() == new_labels.tolist()
    compared = run_cli("compare", tmp_path / "out" / "old.npy", tmp_path / "out" / "new.npy",
                       "--evalset", tmp_path / "out" / "traffic.npz", "--json")
    assert json.loads(compared.out)["changed"] == int((old_labels != new_labels).sum())


def test_nothing_paired_is_refused(run_cli, tmp_path):
    write_kserve(tmp_path / "old.jsonl", [0, 1], v2=False)
    (tmp_path / "new.jsonl").write_text("not json\n")
    result = run_cli("traffic", "import", "--format", "kserve", "--old", tmp_path / "old.jsonl",
                     "--new", tmp_path / "new.jsonl", "--out", tmp_path / "out")
    assert result.code == 2 and "no request was answered by both" in result.err
