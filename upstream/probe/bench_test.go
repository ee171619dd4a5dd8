package probe

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodekit-dev/nodekit/probe"
)

// Run with a fixed count so TIME_WAIT sockets cannot exhaust loopback ports:
//
//	go test -run XXX -bench . -benchtime 2000x .
func BenchmarkProbe(b *testing.B) {
	host, port, gPort := remoteServers(b)
	gHost := host
	cases := []behaviour{
		{"http", httpGet(port, "/ok"), host},
		{"tcp", tcpSocket(port), host},
		{"grpc", grpcCheck(gPort, ""), gHost},
	}
	nk := probe.NewProber(probe.Options{})
	for _, c := range cases {
		b.Run(c.name+"/nodekit", func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			target := probe.Target{Host: c.host}
			for b.Loop() {
				res, err := nk.ProbeOnce(ctx, c.spec, target)
				if err != nil || res.Kind != probe.Success {
					b.Fatalf("%v %v", res, err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "probes/s")
		})
		b.Run(c.name+"/upstream", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				kind, msg, err := runUpstream(c.spec, c.host)
				if err != nil || kind != "success" {
					b.Fatalf("%s %s %v", kind, msg, err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "probes/s")
		})
	}
}

func timeWaitTo(port int) int {
	n := 0
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 4 || fs[3] != "06" {
				continue
			}
			r := fs[2][strings.LastIndexByte(fs[2], ':')+1:]
			if p, _ := strconv.ParseInt(r, 16, 32); int(p) == port {
				n++
			}
		}
	}
	return n
}

// TestTimeWait compares the prober-side TIME_WAIT sockets that 1,000 HTTP and
// 1,000 tcpSocket probes leave behind, upstream against nodekit.
func TestTimeWait(t *testing.T) {
	nk := probe.NewProber(probe.Options{})
	nkReset := probe.NewProber(probe.Options{ResetTCPProbes: true})
	runs := []struct {
		name string
		run  func(b behaviour) string
		tcp  bool
	}{
		{"upstream http", func(b behaviour) string { k, _, _ := runUpstream(b.spec, b.host); return k }, false},
		{"nodekit http", func(b behaviour) string {
			r, _ := nk.ProbeOnce(context.Background(), b.spec, probe.Target{Host: b.host})
			return string(r.Kind)
		}, false},
		{"upstream tcp", func(b behaviour) string { k, _, _ := runUpstream(b.spec, b.host); return k }, true},
		{"nodekit tcp", func(b behaviour) string {
			r, _ := nk.ProbeOnce(context.Background(), b.spec, probe.Target{Host: b.host})
			return string(r.Kind)
		}, true},
		{"nodekit tcp ResetTCPProbes", func(b behaviour) string {
			r, _ := nkReset.ProbeOnce(context.Background(), b.spec, probe.Target{Host: b.host})
			return string(r.Kind)
		}, true},
	}
	for _, r := range runs {
		// A fresh server per run, so earlier sockets are not counted.
		host, port, _ := newHTTPServers(t)
		b := behaviour{spec: httpGet(port, "/ok"), host: host}
		if r.tcp {
			b.spec = tcpSocket(port)
		}
		for range 1000 {
			if k := r.run(b); k != "success" {
				t.Fatalf("%s: %s", r.name, k)
			}
		}
		time.Sleep(100 * time.Millisecond) // let closes finish
		t.Logf("%s: %d prober-side TIME_WAIT sockets after 1000 probes", r.name, timeWaitTo(port))
	}
}
