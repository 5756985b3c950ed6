"""I/O layer: Avro schemas and files, TREC run/qrels files, record validation, converters.

Imports numpy and fastavro only (no Beam, no pandas, nothing from
``streameval.metrics`` or ``streameval.beam``).
"""

from .avro import SCHEMA_NAMES, expand_paths, load_schema, read_blocks, read_records, schema_path, write_records
from .convert import (
    letor_to_records,
    obd_to_impressions,
    trec_qrels_to_judgments,
    trec_run_to_impressions,
    yandex_to_impressions,
)
from .records import check_impression, check_judgment, to_json_text
from .trec import (
    TrecFormatError,
    TrecQrels,
    TrecRun,
    qrels_from_dict,
    qrels_to_dict,
    read_qrels,
    read_run,
    run_from_dict,
    run_to_dict,
    trec_order,
    write_qrels,
    write_run,
)

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
