// The ns-3 side of the cross-check: a star of n hosts, one TCP connection per
// ordered pair that carries messages, and a dependency graph of messages.
// Compiled at run time by cppyy (analysis/ns3_crosscheck/ns3_run.py): no ns-3
// build is needed. Message m is written to its pair's socket `gap_s[m]` after the
// last of its dependencies has arrived (or at gap_s[m] when it has none); it
// arrives when its last byte is read at the receiver. Messages of one pair are
// carried in the order they are released.
#include <algorithm>
#include <deque>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace akocrosscheck {

using namespace ns3;

class StarRun {
  public:
    // One message: from src to dst, size_bytes, released gap_s after its deps.
    void AddMessage(int src, int dst, double size_bytes, double gap_s) {
        m_src.push_back(src);
        m_dst.push_back(dst);
        m_size.push_back(static_cast<uint64_t>(size_bytes));
        m_gap.push_back(gap_s);
        m_waiting.push_back(0);
        m_dependents.emplace_back();
        m_released.push_back(-1.0);
        m_arrived.push_back(-1.0);
    }

    // Message `message` may be released only after `dependency` arrived.
    void AddDependency(int message, int dependency) {
        m_waiting[message] += 1;
        m_dependents[dependency].push_back(message);
    }

    // Build the star, run until every message arrived or stop_s; returns false
    // if some message never arrived.
    bool Run(int n, double rate_bps, double link_delay_s, const std::string& tcp_type,
             uint32_t segment_bytes, uint32_t buffer_bytes, double stop_s) {
        Config::SetDefault("ns3::TcpL4Protocol::SocketType", StringValue(tcp_type));
        Config::SetDefault("ns3::TcpSocket::SegmentSize", UintegerValue(segment_bytes));
        Config::SetDefault("ns3::TcpSocket::SndBufSize", UintegerValue(buffer_bytes));
        Config::SetDefault("ns3::TcpSocket::RcvBufSize", UintegerValue(buffer_bytes));
        NodeContainer hosts;
        hosts.Create(n);
        NodeContainer router;
        router.Create(1);
        InternetStackHelper stack;
        stack.Install(hosts);
        stack.Install(router);
        PointToPointHelper link;
        link.SetDeviceAttribute("DataRate", DataRateValue(DataRate(static_cast<uint64_t>(rate_bps))));
        link.SetChannelAttribute("Delay", TimeValue(Seconds(link_delay_s)));
        Ipv4AddressHelper addresses;
        std::vector<Ipv4Address> host_address;
        for (int i = 0; i < n; ++i) {
            NetDeviceContainer devices = link.Install(hosts.Get(i), router.Get(0));
            std::ostringstream subnet;
            subnet << "10.1." << (i + 1) << ".0";
            addresses.SetBase(subnet.str().c_str(), "255.255.255.0");
            Ipv4InterfaceContainer interfaces = addresses.Assign(devices);
            host_address.push_back(interfaces.GetAddress(0));
        }
        Ipv4GlobalRoutingHelper::PopulateRoutingTables();

        // Which ordered pairs carry messages: one listener and one connection each.
        std::map<std::pair<int, int>, int> pair_index;
        for (size_t m = 0; m < m_src.size(); ++m) {
            auto key = std::make_pair(m_src[m], m_dst[m]);
            if (pair_index.count(key) == 0) {
                int index = static_cast<int>(m_pairs.size());
                pair_index[key] = index;
                m_pairs.emplace_back();
                m_pairs.back().src = key.first;
                m_pairs.back().dst = key.second;
            }
            m_pair_of.push_back(pair_index[key]);
        }
        for (size_t p = 0; p < m_pairs.size(); ++p) {
            Pair& pair = m_pairs[p];
            uint16_t port = static_cast<uint16_t>(10000 + p);
            Ptr<Socket> listener = Socket::CreateSocket(hosts.Get(pair.dst), TcpSocketFactory::GetTypeId());
            listener->Bind(InetSocketAddress(Ipv4Address::GetAny(), port));
            listener->Listen();
            listener->SetAcceptCallback(
                MakeNullCallback<bool, Ptr<Socket>, const Address&>(),
                MakeBoundCallback(&StarRun::Accepted, this, static_cast<int>(p)));
            pair.listener = listener;
            Ptr<Socket> sender = Socket::CreateSocket(hosts.Get(pair.src), TcpSocketFactory::GetTypeId());
            sender->Bind();
            // Connect once the simulation runs (devices are initialised then).
            Simulator::Schedule(Seconds(0), &StarRun::Connect, sender,
                                InetSocketAddress(host_address[pair.dst], port));
            sender->SetSendCallback(MakeBoundCallback(&StarRun::SendSpace, this, static_cast<int>(p)));
            pair.sender = sender;
        }
        for (size_t m = 0; m < m_src.size(); ++m) {
            if (m_waiting[m] == 0) {
                Simulator::Schedule(Seconds(m_gap[m]), &StarRun::Release, this, static_cast<int>(m));
            }
        }
        m_outstanding = m_src.size();
        Simulator::Stop(Seconds(stop_s));
        Simulator::Run();
        Simulator::Destroy();
        return m_outstanding == 0;
    }

    double Arrived(int message) const { return m_arrived[message]; }
    double Released(int message) const { return m_released[message]; }

  private:
    struct Pair {
        int src = 0;
        int dst = 0;
        Ptr<Socket> listener;
        Ptr<Socket> sender;
        uint64_t unsent_bytes = 0;       // released, not yet handed to the socket
        uint64_t released_bytes = 0;     // stream offset after the last released message
        uint64_t received_bytes = 0;
        std::deque<std::pair<uint64_t, int>> due;  // (end offset, message) in release order
    };

    static void Connect(Ptr<Socket> socket, InetSocketAddress peer) { socket->Connect(peer); }

    static void Accepted(StarRun* self, int pair, Ptr<Socket> socket, const Address&) {
        socket->SetRecvCallback(MakeBoundCallback(&StarRun::Readable, self, pair));
    }

    static void SendSpace(StarRun* self, int pair, Ptr<Socket>, uint32_t) { self->Push(pair); }

    static void Readable(StarRun* self, int pair, Ptr<Socket> socket) {
        Pair& p = self->m_pairs[pair];
        Ptr<Packet> packet;
        while ((packet = socket->Recv())) {
            p.received_bytes += packet->GetSize();
            while (!p.due.empty() && p.received_bytes >= p.due.front().first) {
                int message = p.due.front().second;
                p.due.pop_front();
                self->Arrive(message);
            }
        }
    }

    void Release(int message) {
        m_released[message] = Simulator::Now().GetSeconds();
        Pair& p = m_pairs[m_pair_of[message]];
        p.released_bytes += m_size[message];
        p.unsent_bytes += m_size[message];
        p.due.emplace_back(p.released_bytes, message);
        if (m_size[message] == 0) {
            p.due.pop_back();
            Arrive(message);
            return;
        }
        Push(m_pair_of[message]);
    }

    void Push(int pair) {
        Pair& p = m_pairs[pair];
        while (p.unsent_bytes > 0) {
            uint32_t room = p.sender->GetTxAvailable();
            if (room == 0) {
                return;
            }
            uint32_t chunk = static_cast<uint32_t>(std::min<uint64_t>(room, p.unsent_bytes));
            int taken = p.sender->Send(Create<Packet>(chunk));
            if (taken <= 0) {
                return;
            }
            p.unsent_bytes -= static_cast<uint64_t>(taken);
        }
    }

    void Arrive(int message) {
        m_arrived[message] = Simulator::Now().GetSeconds();
        m_outstanding -= 1;
        if (m_outstanding == 0) {
            Simulator::Stop();
        }
        for (int next : m_dependents[message]) {
            m_waiting[next] -= 1;
            if (m_waiting[next] == 0) {
                Simulator::Schedule(Seconds(m_gap[next]), &StarRun::Release, this, next);
            }
        }
    }

    size_t m_outstanding = 0;
    std::vector<int> m_src, m_dst, m_pair_of;
    std::vector<uint64_t> m_size;
    std::vector<double> m_gap, m_released, m_arrived;
    std::vector<int> m_waiting;
    std::vector<std::vector<int>> m_dependents;
    std::vector<Pair> m_pairs;
};

}  // namespace akocrosscheck
