"""The Arrow Flight SQL server: a protocol codec over ``ivm.Database``.

Flight SQL (what the ADBC and JDBC drivers speak):

* ``CreatePreparedStatement`` -> a handle; queries say their schema, DDL and
  DML say ``is_update``. A parameterless query runs right away (its result is
  reused by the execution that follows when nothing was published between).
* ``DoPut(CommandPreparedStatementUpdate | CommandStatementUpdate)`` runs
  statements and answers one ``DoPutUpdateResult`` with the rows affected;
  ``DoPut(CommandPreparedStatementQuery)`` binds parameters;
  ``DoPut(CommandStatementIngest)`` (``adbc_ingest``) appends a change batch.
* ``GetFlightInfo(query or catalog command)`` runs it on one snapshot and
  returns one endpoint whose ticket fetches the result once; the offset the
  result reflects is in the FlightInfo's app metadata (``{"offset": N}``) and
  in schema metadata ``ivm.offset``.
* ``SUBSCRIBE [TO] v ...`` (subscribe.py), as a statement or prepared: its
  GetFlightInfo reads the relation's rows (or checks its ``AS OF`` offset:
  errors are the statement's) and answers an endpoint whose DoGet stream
  stays open, sending Materialize-style change rows as they commit and an
  empty batch every second while nothing changes (a write to a departed
  client fails then, which ends the stream and frees its thread). The
  FlightInfo's app metadata ``{"offset": N}`` is the offset it starts after.

Plain Flight: ``FlightDescriptor.for_path(name)`` reads a table or view the
same way; ``list_flights`` lists them; ``DoPut`` on a path appends a change
batch and answers ``{"offset": N, "rows": n}``; ``DoGet`` also takes the
tickets ``{"read": name}`` and ``{"subscribe": view, ...}`` (see
subscriptions.py).

Idempotent producers (``Database.apply_changes(..., source=, seq=)``): a
change batch sent by plain ``DoPut`` or by ``adbc_ingest`` may carry its
producer key, so a retry after a lost acknowledgement is applied once and
answered with the first offset (a seq below the source's last one that is not
remembered is refused). The key is schema metadata ``ivm.source`` (a string)
and ``ivm.seq`` (a decimal integer) of the data — what an ADBC client can
set — or, for plain DoPut, a JSON command descriptor
``{"table": T, "source": S, "seq": N}`` instead of a path; for ``adbc_ingest``
also the ingest options ``ivm.source`` / ``ivm.seq``.

Reads never take the engine's write lock; handlers run on pyarrow's threads.
"""

from __future__ import annotations

import functools
import json
import threading
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.flight as fl

import ivm
from ivm.cdc import debezium
from flight_server import metadata, protocol, subscribe
from flight_server.auth import Handshake, TokenAuth
from flight_server.errors import InvalidArgument, NotFound, Unimplemented, translated, translated_stream
from flight_server.sessions import Bounded, Prepared
from flight_server.statements import Shapes, run_query, run_update
from flight_server.subscriptions import Subscription, open_stream

OFFSET_KEY = b"ivm.offset"
COMMAND_CACHE_BYTES = 256  # commands up to this size are decoded once (handles, short queries)
INGEST_UNSUPPORTED = (
    "adbc_ingest mode {mode!r} is not supported: create the table with CREATE TABLE (with its PRIMARY KEY), "
    "then ingest with mode='append'"
)
TRANSACTIONS_UNSUPPORTED = "transactions are not supported: every statement commits on its own (use autocommit=True)"
ACTIONS = {
    "CreatePreparedStatement": "prepare a SQL statement (Flight SQL)",
    "ClosePreparedStatement": "close a prepared statement (Flight SQL)",
    "CloseSession": "end the session (nothing to clean up)",
    "IngestDebezium": 'apply Debezium JSON events: body = {"table": T, "source": S (optional)} on the first '
                      "line, then one event per line; returns the outcome as JSON",
}


class IvmFlightServer(fl.FlightServerBase):
    def __init__(self, db: ivm.Database, location: str, *, auth_token: str | None = None,
                 tls_certificates: list[fl.CertKeyPair] | None = None, results_limit: int = 1024,
                 results_ttl: float = 300.0, results_budget: int = 1 << 30, **kwargs: Any):
        middleware = dict(kwargs.pop("middleware", {}))
        if auth_token:
            middleware["auth"] = TokenAuth(auth_token)
        super().__init__(location, auth_handler=Handshake() if auth_token else None, middleware=middleware,
                         tls_certificates=tls_certificates or [], **kwargs)
        self.db = db
        # Results waiting for their DoGet: bounded in number, age and bytes.
        self.results: Bounded[pa.Table] = Bounded("result", results_limit, results_ttl, results_budget,
                                                  lambda table: table.nbytes)
        self.statements: Bounded[Prepared] = Bounded("prepared statement", 4096)
        # SUBSCRIBE streams opened by GetFlightInfo, waiting for their DoGet (with their first rows).
        self.subscriptions: Bounded[tuple] = Bounded("subscription", 256, results_ttl, results_budget,
                                                     lambda opened: opened[0].nbytes)
        self.stopping = threading.Event()  # ends live subscriptions on shutdown
        self.shapes = Shapes(db)

    def stop(self) -> None:
        """Stop: end subscriptions, finish in-flight calls, then return."""
        self.stopping.set()
        self.shutdown()

    # --- results ------------------------------------------------------------------------
    def _info(self, table: pa.Table, descriptor: fl.FlightDescriptor) -> fl.FlightInfo:
        """Keep ``table`` for one DoGet and describe it."""
        nbytes = table.nbytes
        handle = self.results.add(table, nbytes)
        ticket = fl.Ticket(b'{"result": "%s"}' % handle.hex().encode())
        offset = (table.schema.metadata or {}).get(OFFSET_KEY)
        offset = int(offset) if offset is not None else self.db.offset
        return fl.FlightInfo(table.schema, descriptor, [fl.FlightEndpoint(ticket, [])], table.num_rows,
                             nbytes, app_metadata=b'{"offset": %d}' % offset)

    def _read(self, name: str) -> pa.Table:
        return self.db.sql(f"SELECT * FROM {_quote(name)}")

    # --- Flight: discovery -----------------------------------------------------------------
    @translated
    def list_flights(self, context: fl.ServerCallContext, criteria: bytes) -> Iterator[fl.FlightInfo]:
        infos = []
        for info in self.db.objects():
            ticket = fl.Ticket(json.dumps({"read": info.name}).encode())
            infos.append(fl.FlightInfo(info.schema, fl.FlightDescriptor.for_path(info.name),
                                       [fl.FlightEndpoint(ticket, [])], -1, -1,
                                       app_metadata=json.dumps({"kind": info.kind}).encode()))
        return iter(infos)

    @translated
    def get_flight_info(self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor) -> fl.FlightInfo:
        if descriptor.descriptor_type == fl.DescriptorType.PATH:
            return self._info(self._read(_path_name(descriptor)), descriptor)
        name, command = unpack(descriptor.command)
        if name == "CommandPreparedStatementQuery":
            statement = self.statements.get(command.get("prepared_statement_handle", b""))
            if statement.subscription is not None:
                return self._subscribe(statement.subscription, descriptor)
            return self._info(self._execute_prepared(statement), descriptor)
        if name == "CommandStatementQuery":
            subscription = subscribe.parse(_text(command.get("query")))
            if subscription is not None:
                return self._subscribe(subscription, descriptor)
        return self._info(self._command_result(name, command), descriptor)

    def _subscribe(self, subscription: subscribe.Subscription, descriptor: fl.FlightDescriptor) -> fl.FlightInfo:
        """Open a SUBSCRIBE's feed now (its errors are the statement's); its DoGet streams it."""
        feed = subscribe.Feed(self.db, subscription.view, subscription.since)
        target = subscribe.schema(feed.relation_schema, subscription.progress)
        handle = self.subscriptions.add((feed, subscription, target))
        ticket = fl.Ticket(b'{"subscription": "%s"}' % handle.hex().encode())
        return fl.FlightInfo(target, descriptor, [fl.FlightEndpoint(ticket, [])], -1, -1,
                             app_metadata=b'{"offset": %d}' % feed.start)

    def _subscription_batches(self, feed: subscribe.Feed, subscription: subscribe.Subscription,
                              target: pa.Schema) -> Iterator[pa.RecordBatch]:
        for rows in subscribe.sql_rows(feed, subscription, target, self.stopping.is_set):
            if rows.num_rows:
                yield from rows.to_batches(max_chunksize=subscribe.CHUNK_ROWS)
            else:  # a heartbeat: writing it to a departed client fails, which ends the stream
                yield pa.RecordBatch.from_pylist([], schema=target)

    def _command_result(self, name: str, command: dict) -> pa.Table:
        if name == "CommandStatementQuery":
            return self.db.sql(_text(command.get("query")))
        if name == "CommandGetSqlInfo":
            return metadata.sql_info(command.get("info", []))
        if name == "CommandGetCatalogs":
            return metadata.catalogs()
        if name == "CommandGetDbSchemas":
            return metadata.db_schemas(command.get("catalog"), command.get("db_schema_filter_pattern"))
        if name == "CommandGetTables":
            return metadata.tables(self.db, command)
        if name == "CommandGetTableTypes":
            return metadata.table_types()
        if name == "CommandGetPrimaryKeys":
            return metadata.primary_keys(self.db, command)
        raise Unimplemented(f"Flight SQL command {name} is not supported")

    @translated
    def get_schema(self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor) -> fl.SchemaResult:
        if descriptor.descriptor_type == fl.DescriptorType.PATH:
            wanted = _path_name(descriptor).lower()
            for info in self.db.objects():
                if info.name == wanted:
                    return fl.SchemaResult(info.schema)
            raise NotFound(f"table or view {wanted} does not exist")
        name, command = unpack(descriptor.command)
        if name == "CommandStatementQuery":
            sql = _text(command.get("query"))
            subscription = subscribe.parse(sql)
            if subscription is not None:
                return fl.SchemaResult(subscribe.columns(self.db, subscription))
            return fl.SchemaResult(self.db.result_schema(sql))
        raise Unimplemented(f"GetSchema of {name} is not supported")

    # --- Flight: DoGet -------------------------------------------------------------------------
    @translated
    def do_get(self, context: fl.ServerCallContext, ticket: fl.Ticket) -> fl.FlightDataStream:
        request = _ticket(ticket.ticket)
        if "result" in request:
            try:
                handle = bytes.fromhex(str(request["result"]))
            except ValueError:
                raise InvalidArgument("malformed result ticket") from None
            return fl.RecordBatchStream(self.results.take(handle))
        if "read" in request:
            return fl.RecordBatchStream(self._read(str(request["read"])))
        if "subscribe" in request:
            return open_stream(self.db, Subscription.from_ticket(request), self.stopping)
        if "subscription" in request:  # a SUBSCRIBE statement's stream (GetFlightInfo opened it)
            try:
                handle = bytes.fromhex(str(request["subscription"]))
            except ValueError:
                raise InvalidArgument("malformed subscription ticket") from None
            feed, subscription, target = self.subscriptions.take(handle)
            return fl.GeneratorStream(target, translated_stream(self._subscription_batches(feed, subscription, target)))
        raise InvalidArgument('unknown ticket: expected {"result": ...}, {"read": "<name>"} or {"subscribe": "<name>"}')

    # --- Flight: DoPut ---------------------------------------------------------------------------
    @translated
    def do_put(self, context: fl.ServerCallContext, descriptor: fl.FlightDescriptor,
               reader: fl.MetadataRecordBatchReader, writer: fl.FlightMetadataWriter) -> None:
        if descriptor.descriptor_type == fl.DescriptorType.PATH or descriptor.command.startswith(b"{"):
            table, key = _put_target(descriptor)
            data = reader.read_all()
            source, seq = _producer(data.schema.metadata, key)
            offset = self.db.apply_changes(table, data, source=source, seq=seq)
            writer.write(json.dumps({"offset": offset, "rows": data.num_rows}).encode())
            return
        name, command = unpack(descriptor.command)
        if name == "CommandStatementUpdate":  # executescript sends no data stream at all
            count = self.db.execute(_text(command.get("query")))
            writer.write(protocol.encode("DoPutUpdateResult", record_count=count))
        elif name == "CommandPreparedStatementUpdate":
            statement = self.statements.get(command.get("prepared_statement_handle", b""))
            count = self._update_prepared(statement, reader.read_all())
            writer.write(protocol.encode("DoPutUpdateResult", record_count=count))
        elif name == "CommandPreparedStatementQuery":
            handle = command.get("prepared_statement_handle", b"")
            self._bind(self.statements.get(handle), reader.read_all())
            writer.write(protocol.encode("DoPutPreparedStatementResult", prepared_statement_handle=handle))
        elif name == "CommandStatementIngest":
            rows = self._ingest(command, reader.read_all())
            writer.write(protocol.encode("DoPutUpdateResult", record_count=rows))
        else:
            raise Unimplemented(f"DoPut of Flight SQL command {name} is not supported")

    def _ingest(self, command: dict, data: pa.Table) -> int:
        options = command.get("table_definition_options", {})
        if_missing = protocol.IF_NOT_EXIST.get(options.get("if_not_exist", 0), "?")
        if_exists = protocol.IF_EXISTS.get(options.get("if_exists", 0), "?")
        mode = {("fail", "append"): "append", ("create", "fail"): "create", ("create", "replace"): "replace",
                ("create", "append"): "create_append"}.get((if_missing, if_exists), f"{if_missing}/{if_exists}")
        if if_exists != "append":
            raise Unimplemented(INGEST_UNSUPPORTED.format(mode=mode))
        if command.get("temporary"):
            raise Unimplemented("adbc_ingest into a temporary table is not supported")
        if command.get("catalog") not in (None, metadata.CATALOG) or command.get("schema") not in (None, metadata.SCHEMA):
            raise NotFound(f"catalog/schema {command.get('catalog')}.{command.get('schema')} does not exist "
                           f"(ivm has {metadata.CATALOG}.{metadata.SCHEMA})")
        table = command.get("table", "")
        if not table:
            raise InvalidArgument("adbc_ingest needs a table name")
        options = command.get("options", {})
        source, seq = _producer(data.schema.metadata, {k[4:]: v for k, v in options.items() if k.startswith("ivm.")})
        try:
            self.db.apply_changes(table, data, source=source, seq=seq)
        except ivm.UnknownObjectError:
            if if_missing == "create":  # create_append of a new table
                raise Unimplemented(INGEST_UNSUPPORTED.format(mode=mode)) from None
            raise
        return data.num_rows

    def _ingest_debezium(self, body: bytes) -> dict:
        head, _, events = body.partition(b"\n")
        try:
            header = json.loads(head)
        except ValueError:
            header = None
        if not isinstance(header, dict) or not isinstance(header.get("table"), str):
            raise InvalidArgument('IngestDebezium: the first line must be {"table": "<name>"} '
                                  '(optionally with "source"), then one event per line')
        return debezium.ingest_text(self.db, header["table"], events, header.get("source")).as_dict()

    # --- prepared statements -------------------------------------------------------------------
    @translated
    def do_action(self, context: fl.ServerCallContext, action: fl.Action) -> list[fl.Result]:
        kind = action.type
        if kind == "CreatePreparedStatement":
            _, request = protocol.unpack(action.body.to_pybytes())
            return [fl.Result(self._prepare(_text(request.get("query"))))]
        if kind == "ClosePreparedStatement":
            _, request = protocol.unpack(action.body.to_pybytes())
            self.statements.discard(request.get("prepared_statement_handle", b""))
            return []
        if kind == "CloseSession":
            return []
        if kind == "IngestDebezium":
            return [fl.Result(json.dumps(self._ingest_debezium(action.body.to_pybytes())).encode())]
        if kind in ("BeginTransaction", "EndTransaction", "BeginSavepoint", "EndSavepoint"):
            raise Unimplemented(TRANSACTIONS_UNSUPPORTED)
        raise Unimplemented(f"action {kind} is not supported")

    def list_actions(self, context: fl.ServerCallContext) -> list[tuple[str, str]]:
        return list(ACTIONS.items())

    def _prepare(self, sql: str) -> bytes:
        subscription = subscribe.parse(sql)
        if subscription is not None:  # nothing runs until it is executed (GetFlightInfo)
            handle = self.statements.add(Prepared(sql, 0, True, subscription=subscription))
            columns = subscribe.columns(self.db, subscription).serialize().to_pybytes()
            return protocol.pack("ActionCreatePreparedStatementResult", prepared_statement_handle=handle,
                                 is_update=False, dataset_schema=columns)
        count, is_query = self.shapes.shape(sql)
        statement = Prepared(sql, count, is_query)
        fields: dict[str, Any] = {"is_update": not is_query}
        if statement.is_query and count == 0:
            version = self.db.version
            result = self.db.sql(sql)
            # Kept in the (byte-bounded) result store; evicted means run again.
            statement.cached = (version, self.results.add(result))
            fields["dataset_schema"] = result.schema.serialize().to_pybytes()
        elif statement.is_query:
            schema = self.shapes.schema(sql, count)
            if schema is not None:
                fields["dataset_schema"] = schema.serialize().to_pybytes()
        if count:
            schema = pa.schema([pa.field(str(i), pa.null()) for i in range(count)])
            fields["parameter_schema"] = schema.serialize().to_pybytes()
        handle = self.statements.add(statement)
        return protocol.pack("ActionCreatePreparedStatementResult", prepared_statement_handle=handle, **fields)

    def _bind(self, statement: Prepared, values: pa.Table) -> None:
        if values.num_columns != statement.parameters:
            raise InvalidArgument(f"the statement takes {statement.parameters} parameter(s), "
                                  f"{values.num_columns} were bound")
        with statement.lock:
            statement.bound = values.combine_chunks().to_batches()[0] if values.num_rows else None
            statement.cached = None

    def _execute_prepared(self, statement: Prepared) -> pa.Table:
        with statement.lock:
            cached, statement.cached = statement.cached, None
            bound = statement.bound
        if cached is not None:
            version, handle = cached
            try:
                result = self.results.take(handle)
            except NotFound:
                result = None
            # Acknowledged writes may not be published yet (a durable database folds
            # them in the background): wait for them before comparing versions.
            self.db.offset
            if result is not None and version == self.db.version:
                return result
        return run_query(self.db, statement.sql, statement.parameters, bound)

    def _update_prepared(self, statement: Prepared, values: pa.Table) -> int:
        return run_update(self.db, statement.sql, statement.parameters, values)


def unpack(data: bytes) -> tuple[str, dict]:
    """``protocol.unpack``, decoded once per command: a prepared lookup sends the very same bytes to bind
    and to run on every execution (decoding them in Python was ~10 us each). Callers only read the fields."""
    return _unpack_cached(data) if len(data) <= COMMAND_CACHE_BYTES else protocol.unpack(data)


@functools.lru_cache(maxsize=1024)
def _unpack_cached(data: bytes) -> tuple[str, dict]:
    return protocol.unpack(data)


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument("the command has no SQL text")
    return value


def _path_name(descriptor: fl.FlightDescriptor) -> str:
    path = [p.decode("utf-8") if isinstance(p, bytes) else str(p) for p in descriptor.path]
    if len(path) != 1 or not path[0]:
        raise InvalidArgument(f"a path descriptor names one table or view, not {path}")
    return path[0]


PRODUCER_KEYS = (b"ivm.source", b"ivm.seq")


def _put_target(descriptor: fl.FlightDescriptor) -> tuple[str, dict]:
    """The table a plain DoPut appends to, and the producer key its JSON command gives (if any)."""
    if descriptor.descriptor_type == fl.DescriptorType.PATH:
        return _path_name(descriptor), {}
    try:
        command = json.loads(descriptor.command)
    except (ValueError, UnicodeDecodeError):
        command = None
    if not isinstance(command, dict) or not isinstance(command.get("table"), str) or not command["table"] \
            or set(command) - {"table", "source", "seq"}:
        raise InvalidArgument('a JSON DoPut command is {"table": "<name>", "source": "<producer>", "seq": <n>}')
    return command["table"], {k: command[k] for k in ("source", "seq") if k in command}


def _producer(metadata: dict | None, given: dict) -> tuple[str | None, int | None]:
    """(source, seq) of a change batch: from ``given`` (a command) or else the schema metadata ivm.source/ivm.seq.

    Validation of the pair (both or neither, seq a non-negative integer) is
    ``apply_changes``'s; here text is only decoded.
    """
    source, seq = given.get("source"), given.get("seq")
    metadata = metadata or {}
    if source is None and b"ivm.source" in metadata:
        source = metadata[b"ivm.source"].decode("utf-8", "replace")
    if seq is None and b"ivm.seq" in metadata:
        seq = metadata[b"ivm.seq"].decode("utf-8", "replace")
    if isinstance(seq, str):
        if not seq.strip().isdigit():
            raise InvalidArgument(f"ivm.seq must be a non-negative decimal integer, not {seq[:40]!r}")
        seq = int(seq)
    return source, seq


def _ticket(raw: bytes) -> dict:
    try:
        request = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise InvalidArgument("not an ivm ticket (tickets are JSON objects)") from None
    if not isinstance(request, dict):
        raise InvalidArgument("not an ivm ticket (tickets are JSON objects)")
    return request


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
