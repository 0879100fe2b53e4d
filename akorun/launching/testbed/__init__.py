"""A real-network testbed for akorun: ranks in network namespaces, tc shaping, teardown.

netns.py builds and deletes the namespaces, bridge and veth pairs; shaping.py
plans the tc commands that realise a config's network; runner.py runs a
launch inside them (`akorun launch --testbed netns`); probe.py measures a
TCP transfer between two namespaces. The record of what was configured is
akocore.records.testbed_record (akosim reads it).
"""
