"""Results as data: the typed records akosim and akorun write and analysis reads.

- `results`: the run, rank, plan and sweep records and their JSON schema;
- `result_reader`: a record read from where it is (a file, a run directory);
- `jsonrecord`: frozen dataclasses <-> JSON objects, checked against their hints;
- `figures`: derived figures defined once for every reader;
- `testbed_record`, `host_calibration`, `message_cost`: what a testbed configured,
  what `akosim calibrate` measured, what one message costs akorun's software.

Nothing is re-exported here: import the module that owns the record.
"""
