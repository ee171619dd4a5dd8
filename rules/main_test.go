package rules_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/nodekit-dev/nodekit/rules"
)

// writerEnv, when set, turns the test binary into a one-shot rules writer: it syncs
// the JSON state in writerStateEnv into the nftables table writerTableEnv of the
// network namespace it was started in, then exits. Tests use it to show that rules
// outlive the process that wrote them.
const (
	writerEnv      = "NODEKIT_RULES_WRITER"
	writerStateEnv = "NODEKIT_RULES_STATE"
	writerTableEnv = "NODEKIT_RULES_TABLE"
)

func TestMain(m *testing.M) {
	if os.Getenv(writerEnv) != "" {
		os.Exit(runWriter(os.Getenv(writerEnv)))
	}
	goleak.VerifyTestMain(m)
}

func runWriter(backend string) int {
	var st rules.State
	if err := json.Unmarshal([]byte(os.Getenv(writerStateEnv)), &st); err != nil {
		fmt.Fprintln(os.Stderr, "writer: bad state:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w, err := newSyncer(ctx, backend, os.Getenv(writerTableEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "writer:", err)
		return 1
	}
	if err := w.Sync(ctx, &st); err != nil {
		fmt.Fprintln(os.Stderr, "writer:", err)
		return 1
	}
	return 0
}

// backends are the writers every real-packet test runs against.
var backends = []string{"nftables", "iptables-nft", "iptables-legacy"}

// newSyncer builds the writer for backend; name is the table (nftables) or chain
// prefix (iptables). It runs nft/iptables in the calling thread's namespace.
func newSyncer(ctx context.Context, backend, name string) (rules.Syncer, error) {
	switch backend {
	case "nftables":
		return rules.NewNFTables(rules.NFTablesConfig{Table: name})
	case "iptables-nft":
		return rules.NewIPTables(ctx, rules.IPTablesConfig{Mode: rules.IPTablesNFT, Prefix: name})
	case "iptables-legacy":
		return rules.NewIPTables(ctx, rules.IPTablesConfig{Mode: rules.IPTablesLegacy, Prefix: name})
	}
	return nil, fmt.Errorf("unknown backend %q", backend)
}

// backendTool is the binary a backend needs.
func backendTool(backend string) string {
	return map[string]string{"nftables": "nft", "iptables-nft": "iptables-restore", "iptables-legacy": "iptables-legacy-restore"}[backend]
}

// backendName is a valid table name or chain prefix for backend.
func backendName(backend string) string {
	if backend == "nftables" {
		return "nodekit"
	}
	return "NK"
}
