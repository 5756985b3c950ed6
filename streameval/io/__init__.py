"""I/O layer: Avro schemas and files, TREC run/qrels files, record validation, converters.

Imports numpy and fastavro only (no Beam, no pandas, nothing from
``streameval.metrics`` or ``streameval.beam``); the package's names are imported from their modules
on first use.
"""

import importlib

# the names of the package, each from its module: imported on first use (PEP 562), so that reading
# TREC files (``streameval trec-eval``, ``streameval.evaluate`` on paths) does not import fastavro
# and the Avro, converter and record modules (about 0.09 s of CPU per process)
_FROM = {
    "avro": ("SCHEMA_NAMES", "expand_paths", "load_schema", "read_blocks", "read_records", "schema_path",
             "write_records"),
    "convert": ("letor_to_records", "obd_to_impressions", "trec_qrels_to_judgments", "trec_run_to_impressions",
                "yandex_to_impressions"),
    "records": ("check_impression", "check_judgment", "to_json_text"),
    "trec": ("TrecFormatError", "TrecQrels", "TrecRun", "qrels_from_dict", "qrels_to_dict", "read_qrels", "read_run",
             "run_from_dict", "run_to_dict", "trec_order", "write_qrels", "write_run"),
}
_MODULE_OF = {name: module for module, names in _FROM.items() for name in names}


def __getattr__(name):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_MODULE_OF))


__all__ = [
    "SCHEMA_NAMES",
    "expand_paths",
    "load_schema",
    "read_blocks",
    "read_records",
    "schema_path",
    "write_records",
    "letor_to_records",
    "obd_to_impressions",
    "trec_qrels_to_judgments",
    "trec_run_to_impressions",
    "yandex_to_impressions",
    "check_impression",
    "check_judgment",
    "to_json_text",
    "TrecFormatError",
    "TrecQrels",
    "TrecRun",
    "qrels_from_dict",
    "qrels_to_dict",
    "read_qrels",
    "read_run",
    "run_from_dict",
    "run_to_dict",
    "trec_order",
    "write_qrels",
    "write_run",
]
