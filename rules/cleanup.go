package rules

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	"sigs.k8s.io/knftables"
)

// Cleanup deletes the writer's table, with everything in it, as kube-proxy's
// nftables CleanupLeftovers does; a table that is not there is no error. It
// runs nft in the calling thread's network namespace. The next Sync is full.
func (w *NFTables) Cleanup(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.applied = nil
	w.stale = map[string]bool{}
	tx := w.nft.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := w.nft.Run(ctx, tx); err != nil && !knftables.IsNotFound(err) {
		logr.FromContextOrDiscard(ctx).Error(err, "Error cleaning up nftables rules", "family", w.cfg.Family, "table", w.cfg.Table)
		return fmt.Errorf("%w: deleting table %s %s: %w", ErrApplyFailed, w.cfg.Family.nft(), w.cfg.Table, err)
	}
	return nil
}

// iptablesCleanupChains are, per table in the order they are cleaned, the
// top-level chains kube-proxy's iptables CleanupLeftovers removes (without the
// prefix). The nat table also loses every service chain (iptablesServiceKinds).
// PREFIX-FIREWALL is not among them: it is the kubelet's, which kube-proxy
// writes into but leaves behind, and so does this package.
var iptablesCleanupChains = []struct {
	table  string
	chains []string
}{
	{"nat", []string{"SERVICES", "NODEPORTS", "POSTROUTING", "MARK-MASQ", "PROXY-CANARY"}},
	{"filter", []string{"SERVICES", "EXTERNAL-SERVICES", "FORWARD", "NODEPORTS", "PROXY-FIREWALL", "PROXY-CANARY"}},
	{"mangle", []string{"PROXY-CANARY"}},
}

// iptablesServiceKinds name kube-proxy's per-service chains: a nat chain named
// PREFIX-<kind> followed by anything is removed, as kube-proxy matches them.
var iptablesServiceKinds = []string{"SVC-", "SVL-", "SEP-", "FW-", "EXT-"}

// iptablesCleanup is the removal for one table: the restore payload, empty
// when the table holds nothing of the writer's.
type iptablesCleanup struct {
	table   string
	payload string
}

// cleanupPayloads plans the removal from save, an iptables-save listing of every
// table. In nat and filter each chain is flushed (declared), the jump rules into
// the writer's chains deleted (as often as they appear), then the chains
// deleted; mangle's canary is only deleted, so a chain someone filled stays, as
// kube-proxy's plain `iptables -X` leaves it.
func (w *IPTables) cleanupPayloads(save string) []iptablesCleanup {
	have := map[string]map[string]bool{} // table -> chain -> declared
	rules := map[string][]string{}       // table -> "-A ..." lines
	table := ""
	for _, line := range strings.Split(save, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			table = line[1:]
			have[table] = map[string]bool{}
		case strings.HasPrefix(line, ":") && table != "":
			if name, _, ok := strings.Cut(line[1:], " "); ok {
				have[table][name] = true
			}
		case strings.HasPrefix(line, "-A ") && table != "":
			rules[table] = append(rules[table], line)
		}
	}
	var out []iptablesCleanup
	for _, t := range iptablesCleanupChains {
		var chains []string
		for _, c := range t.chains {
			if have[t.table][w.chain(c)] {
				chains = append(chains, w.chain(c))
			}
		}
		if t.table == "nat" {
			var svc []string
			for name := range have[t.table] {
				for _, k := range iptablesServiceKinds {
					if strings.HasPrefix(name, w.chain(k)) {
						svc = append(svc, name)
						break
					}
				}
			}
			slices.Sort(svc)
			chains = append(chains, svc...)
		}
		var deletes []string
		for _, j := range w.proxyJumps() {
			if j[0] != t.table {
				continue
			}
			rule := "-A " + j[1] + " " + j[2]
			for _, r := range rules[t.table] {
				if r == rule {
					deletes = append(deletes, "-D "+j[1]+" "+j[2])
				}
			}
		}
		if len(chains) == 0 && len(deletes) == 0 {
			continue
		}
		var b strings.Builder
		fmt.Fprintf(&b, "*%s\n", t.table)
		if t.table != "mangle" {
			for _, c := range chains {
				fmt.Fprintf(&b, ":%s - [0:0]\n", c)
			}
		}
		for _, d := range deletes {
			b.WriteString(d + "\n")
		}
		for _, c := range chains {
			fmt.Fprintf(&b, "-X %s\n", c)
		}
		b.WriteString("COMMIT\n")
		out = append(out, iptablesCleanup{table: t.table, payload: b.String()})
	}
	return out
}

// Cleanup removes what kube-proxy's iptables CleanupLeftovers removes, for the
// writer's family, backend and chain prefix: the jump rules from the built-in
// chains into PREFIX- chains (the rules Sync inserts, matched word for word);
// in nat PREFIX-SERVICES, -NODEPORTS, -POSTROUTING, -MARK-MASQ,
// -PROXY-CANARY and every chain named PREFIX-SVC-, -SVL-, -SEP-, -FW- or -EXT-
// followed by anything; in filter PREFIX-SERVICES, -EXTERNAL-SERVICES,
// -FORWARD, -NODEPORTS, -PROXY-FIREWALL and -PROXY-CANARY; in mangle an empty
// PREFIX-PROXY-CANARY. PREFIX-FIREWALL and its jumps (the kubelet's, which Sync
// writes with LocalhostNodePorts) and every other chain and rule stay.
//
// It reads the tables once with iptables-save and writes each table that holds
// something to remove with one iptables-restore --noflush, so each table
// changes atomically; a table that fails (a foreign rule still jumping into a
// removed chain, say) is logged with kube-proxy's message and the others are
// still cleaned. The processes run in the calling thread's network namespace.
// The next Sync is full.
func (w *IPTables) Cleanup(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.applied = nil
	log := logr.FromContextOrDiscard(ctx)
	save, err := w.run(ctx, "", w.cfg.binary("iptables-save"))
	if err != nil {
		log.Error(err, "Failed to execute iptables-save", "family", w.cfg.Family)
		return fmt.Errorf("%w: read tables: %w", ErrApplyFailed, err)
	}
	var errs []error
	for _, c := range w.cleanupPayloads(save) {
		_, err := w.run(ctx, c.payload, w.cfg.binary("iptables-restore"), "-w", "--noflush", "--counters")
		if err == nil {
			continue
		}
		if c.table == "mangle" {
			// kube-proxy ignores a canary it cannot delete.
			log.V(2).Info("Could not delete the mangle canary chain", "family", w.cfg.Family, "err", err.Error())
			continue
		}
		log.Error(err, "Failed to execute iptables-restore", "table", c.table, "family", w.cfg.Family)
		errs = append(errs, fmt.Errorf("%w: %s table %s: %w", ErrApplyFailed, w.cfg.binary("iptables-restore"), c.table, err))
	}
	return errors.Join(errs...)
}
