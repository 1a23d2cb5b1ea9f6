"""storage.schemas.SchemaMap: a dict keyed by Arrow schemas, found by equality instead of hashing."""

import pyarrow as pa
import pytest

from storage.schemas import SchemaMap


def schema(*types, metadata=None):
    return pa.schema([pa.field(f"c{i}", t) for i, t in enumerate(types)], metadata=metadata)


def test_finds_an_equal_schema_that_is_another_object():
    known = SchemaMap()
    known[schema(pa.int64(), pa.string())] = "a"
    assert known.get(schema(pa.int64(), pa.string())) == "a"
    assert schema(pa.int64(), pa.string()) in known
    assert known[schema(pa.int64(), pa.string())] == "a"


def test_tells_schemas_apart_as_a_dict_does():
    known, reference = SchemaMap(), {}
    schemas = [schema(pa.int64()), schema(pa.int32()), schema(pa.int64(), pa.int64()),
               pa.schema([pa.field("other", pa.int64())]), pa.schema([pa.field("c0", pa.int64(), nullable=False)])]
    for i, s in enumerate(schemas):
        known[s] = reference[s] = i
    for s in schemas + [schema(pa.float64())]:
        assert known.get(s) == reference.get(s)
    assert len(known) == len(reference) == len(schemas)
    with pytest.raises(KeyError):
        known[schema(pa.float64())]


def test_metadata_does_not_count_as_for_equality():
    """A read's result is stamped with its offset in the metadata; ``==`` ignores it, so does the map
    (a dict does not: the hash covers metadata)."""
    plain, stamped = schema(pa.int64()), schema(pa.int64(), metadata={"offset": "3"})
    assert plain == stamped and {plain: 1}.get(stamped) is None
    known = SchemaMap()
    known[plain] = 1
    assert known.get(stamped) == 1 and known.values() == [1]


def test_a_write_replaces_the_value_and_a_limit_drops_the_oldest():
    known = SchemaMap(limit=2)
    known[schema(pa.int8())] = 1
    known[schema(pa.int8())] = 2
    assert known.get(schema(pa.int8())) == 2 and len(known) == 1
    known[schema(pa.int16())] = 3
    known[schema(pa.int32())] = 4
    assert schema(pa.int8()) not in known and known.get(schema(pa.int32())) == 4 and len(known) == 2
    assert schema(pa.int16()) in known and schema(pa.int32()) in known
    assert known.get(schema(pa.int8()), "none") == "none"
