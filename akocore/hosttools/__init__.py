"""The host's network tooling, written once: the `ip` and `tc` commands of a netns testbed.

The netns testbed (akorun.launching.testbed), ``akosim calibrate --netns-rate``
(akosim.calibration.netns_probe) and the analysis' real-TCP probes
(analysis.tcp_connections, ...) build the same kernel objects: network namespaces,
veth pairs, a bridge, addresses, and an htb or tbf queue on an egress. This
package says which commands do that, once, as argv tuples:

- `netns_commands`: namespaces, veth pairs, bridge ports, addresses; what the host
  lacks for them (`missing_requirements`);
- `shaping`: the tc trees that realise a config's network (htb with drop-tail
  bfifo leaves, per-pair caps) and a plain tbf.

It lives in akocore because it is the one layer akorun and akosim may both
import (the shells never import each other) and analysis imports all three. It
stays pure like the rest of akocore: nothing here runs a command, reads a clock
or touches the host; each shell runs the argv with its own executor and error
(akorun.launching.testbed.netns.run_command, the probe's, the analysis').
"""
