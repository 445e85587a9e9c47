"""The checked-in JSON Schema files and DDL are what the code uses."""

from __future__ import annotations

from allmende.schemas.export import OUT, rendered


def test_checked_in_json_schemas_match_the_event_models() -> None:
    files = rendered()
    on_disk = {p.name: p.read_text() for p in OUT.glob("*.json")}
    assert set(on_disk) == set(files), "run `make schemas`"
    drifted = [name for name, text in files.items() if on_disk[name] != text]
    assert not drifted, f"stale JSON Schema files (run `make schemas`): {drifted}"


def test_the_job_event_schema_names_every_event_type() -> None:
    import json

    schema = json.loads(rendered()["job-event.schema.json"])
    assert set(schema["discriminator"]["mapping"]) == {
        "JobSubmitted", "JobStarted", "JobUsageSample", "JobPreempted", "JobFinished",
    }  # fmt: skip


def test_the_admin_event_schema_names_every_admin_event_type() -> None:
    import json

    from allmende.schemas.admin_events import ADMIN_EVENT_TYPES

    schema = json.loads(rendered()["admin-event.schema.json"])
    assert set(schema["discriminator"]["mapping"]) == {m.__name__ for m in ADMIN_EVENT_TYPES}


def test_every_event_type_names_its_key_on_the_topic() -> None:
    from allmende.schemas.admin_events import ADMIN_EVENT_TYPES
    from allmende.schemas.admission_events import ADMISSION_EVENT_TYPES

    for model in (*ADMIN_EVENT_TYPES, *ADMISSION_EVENT_TYPES):
        template = vars(model).get("KEY")
        assert isinstance(template, str) and template, f"{model.__name__} has no KEY"
        fields = {name.strip("{}") for name in template.split(":")[-1].split("/") if name.startswith("{")}
        assert fields <= set(model.model_fields), f"{model.__name__}.KEY names unknown fields {fields}"
