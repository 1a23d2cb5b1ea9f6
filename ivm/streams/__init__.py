"""Event time: watermarks and late rows, the state of closed windows dropped, interval joins.

Entered from ingest (``event_time``) and from maintenance (``window_state``, ``interval_join``).
"""
