"""Write the JSON Schema files under schemas/jsonschema from the pydantic models.

`python -m allmende.schemas.export` regenerates them; `--check` exits 1 when the files have drifted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from allmende.schemas.admin_events import ADMIN_EVENT_TYPES, admin_event_json_schema
from allmende.schemas.admission_events import ADMISSION_EVENT_TYPES, admission_event_json_schema
from allmende.schemas.alert_events import ALERT_EVENT_TYPES, alert_event_json_schema
from allmende.schemas.dead_letter import DeadLetter
from allmende.schemas.events import JOB_EVENT_TYPES, job_event_json_schema
from allmende.schemas.gpu_samples import GpuSamples

OUT = Path(__file__).resolve().parent / "jsonschema"


def rendered() -> dict[str, str]:
    docs: dict[str, object] = {"job-event.schema.json": job_event_json_schema()}
    for model in JOB_EVENT_TYPES:
        docs[f"{model.__name__}.schema.json"] = model.model_json_schema()
    docs["admin-event.schema.json"] = admin_event_json_schema()
    for model in ADMIN_EVENT_TYPES:
        docs[f"{model.__name__}.schema.json"] = model.model_json_schema()
    docs["admission-event.schema.json"] = admission_event_json_schema()
    for model in ADMISSION_EVENT_TYPES:
        docs[f"{model.__name__}.schema.json"] = model.model_json_schema()
    docs["alert-event.schema.json"] = alert_event_json_schema()
    for model in ALERT_EVENT_TYPES:
        docs[f"{model.__name__}.schema.json"] = model.model_json_schema()
    docs["DeadLetter.schema.json"] = DeadLetter.model_json_schema()
    docs["GpuSamples.schema.json"] = GpuSamples.model_json_schema()
    return {name: json.dumps(doc, indent=2, sort_keys=True) + "\n" for name, doc in docs.items()}


def main(argv: list[str]) -> int:
    files = rendered()
    if "--check" in argv:
        stale = [n for n, text in files.items() if not (OUT / n).exists() or (OUT / n).read_text() != text]
        for name in stale:
            sys.stderr.write(f"schemas/jsonschema/{name} differs from the models: run make schemas\n")
        return 1 if stale else 0
    OUT.mkdir(exist_ok=True)
    for name, text in files.items():
        (OUT / name).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
