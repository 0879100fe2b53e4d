"""akosim's network: what it is, how it shares, and the models built on that.

- netspec: NetworkSpec, the nodes' NIC capacities and each pair's cap and latency;
- maxmin: the max-min fair sharing rule (full and incremental solves);
- fluid: FluidFlows, the clock-free flow-level fluid model;
- fluidnet: FluidNetwork, the fluid model on a SimPy clock (the max-min model);
- netstats: traffic counters and utilisation;
- layers over a network, each one behaviour: tcpmodel (TCP corrections),
  senderfifo (first come, first sent), pairstream (one in-order stream per pair);
- netmodel: the NetworkModel protocol the engine drives, the models by name
  (`--network-model`) and `build_network_model`, the one way to build one.
"""
