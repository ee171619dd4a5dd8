package rules

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeRunner records iptables calls and answers iptables-save with save.
type fakeRunner struct {
	calls    []string
	stdins   []string
	save     string
	failNext error
}

func (f *fakeRunner) run(_ context.Context, stdin, name string, args ...string) (string, error) {
	f.calls = append(f.calls, strings.TrimSpace(name+" "+strings.Join(args, " ")))
	f.stdins = append(f.stdins, stdin)
	if f.failNext != nil && strings.HasSuffix(name, "-restore") {
		err := f.failNext
		f.failNext = nil
		return "", err
	}
	if strings.HasSuffix(name, "-save") {
		return f.save, nil
	}
	return "", nil
}

func TestIPTablesSyncSequence(t *testing.T) {
	ctx := context.Background()
	cfg := IPTablesConfig{Mode: IPTablesLegacy, Prefix: "NK"}
	require.NoError(t, cfg.setDefaults())
	fr := &fakeRunner{save: "*nat\n:NK-SVC-AAAAAAAAAAAAAAAA - [0:0]\n-A PREROUTING -m comment --comment \"kubernetes service portals\" -j NK-SERVICES\nCOMMIT\n"}
	w := &IPTables{cfg: cfg, run: fr.run}
	st := sampleState()

	require.NoError(t, w.Sync(ctx, st))
	require.Equal(t, []string{"iptables-legacy-save", "iptables-legacy-restore -w --noflush --counters"}, fr.calls)
	payload := fr.stdins[1]
	assert.Contains(t, payload, "-X NK-SVC-AAAAAAAAAAAAAAAA\n", "a leftover service chain of the prefix is deleted")
	assert.NotContains(t, payload, "-I PREROUTING", "an existing jump rule is not inserted twice")
	assert.Contains(t, payload, "-I OUTPUT -m comment --comment \"kubernetes service portals\" -j NK-SERVICES\n")
	assert.Less(t, strings.Index(payload, "*nat"), strings.Index(payload, "*filter"), "nat is written first")

	fr.calls, fr.stdins = nil, nil
	st.Services[1].Endpoints = st.Services[1].Endpoints[:1]
	require.NoError(t, w.Sync(ctx, st))
	require.Equal(t, []string{"iptables-legacy-restore -w --noflush --counters"}, fr.calls, "a partial sync reads nothing back")
	partial := fr.stdins[0]
	assert.Contains(t, partial, ":NK-SVC-4SW47YFZTEDKD3PK - [0:0]", "the changed service is rewritten")
	assert.NotContains(t, partial, ":NK-SVC-XPGD46QRK7WJZT7O", "an unchanged service is not")
	assert.Contains(t, partial, "-X NK-SEP-C6EBXVWJJZMIWKLZ\n", "the removed endpoint's chain is deleted")
	assert.NotContains(t, partial, "-I ", "jump rules are checked only on full syncs")

	fr.calls = nil
	fr.failNext = errors.New("iptables-restore: line 7 failed")
	err := w.Sync(ctx, st)
	require.ErrorIs(t, err, ErrApplyFailed)
	assert.ErrorContains(t, err, "line 7")
	fr.calls = nil
	require.NoError(t, w.Sync(ctx, st))
	assert.Equal(t, "iptables-legacy-save", fr.calls[0], "the sync after a failure is full")
}

func TestParseSave(t *testing.T) {
	out := `*nat
:NK-SERVICES - [0:0]
-A NK-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment "default/web cluster IP" -m tcp --dport 80 -j NK-SVC-X
-A NK-SEP-Y -p tcp -m comment --comment "say \"hi\"" -m tcp -j DNAT --to-destination 10.244.1.10:8080
COMMIT
`
	got := parseSave(out)["nat"]
	require.Len(t, got, 2)
	assert.Equal(t, iptRule{chain: "NK-SERVICES", dst: "10.96.0.10", proto: "tcp", dport: "80", target: "NK-SVC-X"}, got[0])
	assert.Equal(t, "10.244.1.10:8080", got[1].toDest)
	assert.Equal(t, []string{"-m", "comment", "--comment", `say "hi"`}, splitQuoted(`-m comment --comment "say \"hi\""`))
}

func TestIPTablesConfigValidation(t *testing.T) {
	for _, cfg := range []IPTablesConfig{
		{Prefix: "TOOLONGX"}, {Prefix: "kube"}, {Mode: "ebtables"}, {MasqueradeMark: 3},
		{ClusterCIDR: netip.MustParsePrefix("fd00::/64")},
	} {
		_, err := RenderIPTables(cfg, &State{})
		assert.ErrorIs(t, err, ErrInvalidConfig, "%+v", cfg)
	}
}

// TestIPTablesListFirst: on iptables-nft a full sync lists the nat table before the
// bulk of its commands (see listTrick), after the declarations and jump rules that
// must precede the listing; partial syncs, legacy and a restore that refuses the
// listing write none.
func TestIPTablesListFirst(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		mode      IPTablesMode
		probeFail bool
		wantList  bool
	}{
		{"nft", IPTablesNFT, false, true},
		{"nft refusing the listing", IPTablesNFT, true, false},
		{"legacy", IPTablesLegacy, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := IPTablesConfig{Mode: tc.mode, Prefix: "NK"}
			require.NoError(t, cfg.setDefaults())
			fr := &fakeRunner{save: "*nat\n:PREROUTING ACCEPT [0:0]\n:DOCKER - [0:0]\n-A PREROUTING -j DOCKER\nCOMMIT\n*filter\nCOMMIT\n"}
			w := &IPTables{cfg: cfg, run: fr.run}
			if tc.probeFail {
				fr.failNext = errors.New("iptables-restore: line 2 failed")
			}
			w.listFirst = w.probeListTrick(ctx)
			if tc.mode == IPTablesNFT {
				require.Equal(t, []string{"iptables-restore -w --noflush --test"}, fr.calls, "the probe only parses")
				assert.Equal(t, "*nat\n-S\nCOMMIT\n", fr.stdins[0])
			} else {
				assert.Empty(t, fr.calls, "legacy needs no probe")
			}
			fr.calls, fr.stdins = nil, nil

			st := sampleState()
			require.NoError(t, w.Sync(ctx, st))
			full := fr.stdins[len(fr.stdins)-1]
			nat, filter, ok := strings.Cut(full, "*filter\n")
			require.True(t, ok)
			assert.NotContains(t, filter, "\n-S\n", "filter holds a handful of chains: no listing")
			assert.NotContains(t, full, "DOCKER", "foreign chains are never named")
			if !tc.wantList {
				assert.NotContains(t, nat, "\n-S\n")
				return
			}
			lines := strings.Split(nat, "\n")
			list := slices.Index(lines, "-S")
			require.Positive(t, list, "the full sync lists the nat table:\n%s", nat)
			for i, l := range lines {
				switch {
				case strings.HasPrefix(l, "-I "):
					assert.Less(t, i, list, "jump rules create missing built-in chains before the listing: %s", l)
				case strings.HasPrefix(l, ":NK-SVC-"), strings.HasPrefix(l, ":NK-SEP-"), strings.HasPrefix(l, "-A "):
					assert.Greater(t, i, list, "the bulk follows the listing: %s", l)
				case strings.HasPrefix(l, ":NK-SERVICES "), strings.HasPrefix(l, ":NK-POSTROUTING "):
					assert.Less(t, i, list, "jump targets are declared before the jumps: %s", l)
				}
			}
			assert.Equal(t, 3, strings.Count(nat, "\n-I "), "all three nat jumps were missing")

			fr.stdins = nil
			st.Services[1].Endpoints = st.Services[1].Endpoints[:1]
			require.NoError(t, w.Sync(ctx, st))
			assert.NotContains(t, fr.stdins[0], "\n-S\n", "a partial sync names few chains: no listing")
		})
	}
}
