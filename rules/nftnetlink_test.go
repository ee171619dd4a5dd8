package rules

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// TestRuleExprsCoversEveryGoldenRule: every rule of every nftables golden file is
// inside the grammar the netlink applier translates.
func TestRuleExprsCoversEveryGoldenRule(t *testing.T) {
	goldens, err := filepath.Glob("testdata/nftables-*.golden")
	require.NoError(t, err)
	require.NotEmpty(t, goldens)
	rules := 0
	for _, path := range goldens {
		f, err := os.Open(path)
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.SplitN(sc.Text(), " ", 6) // add rule ip TABLE CHAIN RULE
			if len(fields) < 6 || fields[0] != "add" || fields[1] != "rule" {
				continue
			}
			rule, _ := splitComment(fields[5])
			family := IPv4
			if fields[2] == "ip6" {
				family = IPv6
			}
			exprs, err := ruleExprs(family, rule)
			if assert.NoError(t, err, "%s: %s", path, sc.Text()) {
				assert.NotEmpty(t, exprs)
			}
			rules++
		}
		require.NoError(t, sc.Err())
		require.NoError(t, f.Close())
	}
	assert.Greater(t, rules, 30, "the golden files hold the writer's rule shapes")
}

// TestNetlinkEncodesEveryTransaction: full and partial transactions of states with
// every shape, under every configuration the tests use, encode without error.
func TestNetlinkEncodesEveryTransaction(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range []NFTablesConfig{
		sampleConfig(),
		{Table: "nodekit", MasqueradeAll: true, MasqueradeMark: 0x8000},
		{ClusterCIDR: netip.MustParsePrefix("10.240.0.0/12"),
			ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("172.30.0.0/16")}},
	} {
		w, err := newNFTablesWith(cfg, knftables.NewFake(knftables.IPv4Family, "kube-proxy"))
		require.NoError(t, err)
		a := newNetlinkApplier(IPv4, w.cfg.Table)
		st := sampleState()
		for step, mutate := range []func(){
			func() {},
			func() { st.Services[1].Endpoints = st.Services[1].Endpoints[:1] },
			func() { st.Services[2].AffinityTimeout = time.Minute },
			func() { st.Services = st.Services[1:] },
			func() { st.Services[0].Endpoints = nil },
		} {
			mutate()
			require.NoError(t, w.Sync(ctx, st))
			w.applier = a
			tx, _, _, err := w.transaction(ctx, st, nil)
			require.NoError(t, err)
			w.applier = cliApplier{w.nft}
			_, _, err = a.encode(tx)
			require.NoError(t, err, "step %d", step)
		}
	}
}

func TestRuleExprsRejectsUnknownForms(t *testing.T) {
	for _, rule := range []string{
		"",
		"counter",
		"ct state established",
		"ip daddr { 10.0.0.0/8, 11.0.0.0/8 } drop",
		"ip6 daddr ::1 drop",
		"meta l4proto icmp drop",
		"ip daddr . meta l4proto drop",
		"dnat to [fd00::1]:80",
		"dnat to 10.0.0.1",
		"numgen random mod 2 2 drop",
		"mark set mark and 0x10",
		"masquerade",
		"jump",
		"update @s { ip daddr }",
		"ip daddr 10.0.0.1 drop comment \"x\"",
	} {
		_, err := ruleExprs(IPv4, rule)
		assert.ErrorIs(t, err, errUnsupportedRule, "%q", rule)
	}
}

// TestRuleExprsMatchesNFT pins a few translations to the bytecode nft 1.0.6 prints
// with --debug=netlink for the same text.
func TestRuleExprsMatchesNFT(t *testing.T) {
	le32 := func(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }
	for _, tc := range []struct {
		rule string
		want []expr.Any
	}{
		{"ip saddr != 10.0.0.0/8 drop", []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{10}},
			&expr.Verdict{Kind: expr.VerdictDrop}}},
		{"ip daddr { 10.240.0.0/12 } drop", []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{255, 240, 0, 0}, Xor: []byte{0, 0, 0, 0}},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{10, 240, 0, 0}},
			&expr.Verdict{Kind: expr.VerdictDrop}}},
		{"ip daddr . meta l4proto . th dport vmap @service-ips", []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 9},
			&expr.Payload{DestRegister: 10, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: 1, SetName: "service-ips", DestRegister: 0, IsDestRegSet: true}}},
		{"meta l4proto tcp numgen random mod 2 0 dnat to 10.180.0.4:80", []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{6}},
			&expr.Numgen{Register: 1, Modulus: 2, Type: unix.NFT_NG_RANDOM},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: le32(0)},
			&expr.Immediate{Register: 1, Data: []byte{10, 180, 0, 4}},
			&expr.Immediate{Register: 2, Data: []byte{0, 80}},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true}}},
		{"mark set mark or 0x4000", []expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: le32(0xffffbfff), Xor: le32(0x4000)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1}}},
	} {
		got, err := ruleExprs(IPv4, tc.rule)
		require.NoError(t, err, tc.rule)
		assert.Equal(t, tc.want, got, tc.rule)
	}
}

// TestElementChunks: a container with thousands of elements is split into messages
// whose element list fits an attribute's 16-bit length, all in one batch.
func TestElementChunks(t *testing.T) {
	a := newNetlinkApplier(IPv4, "t")
	tx := &nftTx{}
	tx.add(&knftables.Map{Name: mapServiceIPs, Type: "ipv4_addr . inet_proto . inet_service : verdict"})
	const n = 2500
	for i := range n {
		tx.add(&knftables.Element{Map: mapServiceIPs,
			Key:   []string{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}).String(), "tcp", "80"},
			Value: []string{"goto service-" + strings.Repeat("x", 100) + fmt.Sprint(i)}})
	}
	b, _, err := a.encode(tx)
	require.NoError(t, err)
	msgs, err := syscall.ParseNetlinkMessage(b.buf)
	require.NoError(t, err)
	require.Equal(t, uint16(unix.NFNL_MSG_BATCH_BEGIN), msgs[0].Header.Type)
	require.Equal(t, uint16(unix.NFNL_MSG_BATCH_END), msgs[len(msgs)-1].Header.Type)
	elements, elementMessages := 0, 0
	for _, m := range msgs[1 : len(msgs)-1] {
		if m.Header.Type != unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWSETELEM {
			continue
		}
		elementMessages++
		attrs, err := netlink.UnmarshalAttributes(m.Data[4:])
		require.NoError(t, err)
		for _, at := range attrs {
			if at.Type&^unix.NLA_F_NESTED == unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				assert.Less(t, len(at.Data), 65535-4)
				list, err := netlink.UnmarshalAttributes(at.Data)
				require.NoError(t, err)
				assert.LessOrEqual(t, len(list), nftElementsPerMessage)
				elements += len(list)
			}
		}
	}
	assert.Equal(t, n, elements)
	assert.Greater(t, elementMessages, n/nftElementsPerMessage, "long values force more, smaller messages")
}

// TestNFTablesPartialValidation: a partial sync validates only what changed, yet
// refuses what State.Validate refuses, and keeps the applied state.
func TestNFTablesPartialValidation(t *testing.T) {
	ctx := context.Background()
	w, err := newNFTablesWith(sampleConfig(), knftables.NewFake(knftables.IPv4Family, "kube-proxy"))
	require.NoError(t, err)
	require.NoError(t, w.Sync(ctx, sampleState()))
	for _, tc := range []struct {
		name   string
		mutate func(*State)
		want   string
	}{
		{"duplicate port", func(s *State) { s.Services = append(s.Services, s.Services[0]) }, "listed twice"},
		{"new port claims a taken cluster IP", func(s *State) {
			dup := s.Services[0]
			dup.Name = "other"
			s.Services = append(s.Services, dup)
		}, "both claim"},
		{"changed port claims another's node port", func(s *State) { s.Services[2].NodePort = s.Services[1].NodePort }, "both claim"},
		{"changed port is invalid", func(s *State) { s.Services[0].Endpoints[0].Port = 0 }, "port out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := sampleState()
			tc.mutate(st)
			require.Error(t, st.Validate(), "State.Validate refuses it too")
			err := w.Sync(ctx, st)
			require.ErrorIs(t, err, ErrInvalidState)
			assert.Contains(t, err.Error(), tc.want)
			out, err := w.DryRun(ctx, sampleState())
			require.NoError(t, err)
			assert.Empty(t, out, "the applied state is kept: nothing to write")
		})
	}
	t.Run("ports may swap a destination in one sync", func(t *testing.T) {
		st := sampleState()
		st.Services[1].NodePort, st.Services[2].NodePort = st.Services[2].NodePort, st.Services[1].NodePort
		require.NoError(t, st.Validate())
		require.NoError(t, w.Sync(ctx, st))
	})
}

// TestServiceSameSeesEveryField: a partial sync skips service ports that
// serviceSame calls unchanged, so it must compare every field of Service, including
// any added later.
func TestServiceSameSeesEveryField(t *testing.T) {
	base := sampleState().Services[2] // has every slice non-empty or settable
	typ := reflect.TypeOf(base)
	for i := range typ.NumField() {
		f := typ.Field(i)
		t.Run(f.Name, func(t *testing.T) {
			changed := base
			changed.ExternalIPs = slices.Clone(base.ExternalIPs)
			changed.LoadBalancerIPs = slices.Clone(base.LoadBalancerIPs)
			changed.LoadBalancerSourceRanges = slices.Clone(base.LoadBalancerSourceRanges)
			changed.Endpoints = slices.Clone(base.Endpoints)
			v := reflect.ValueOf(&changed).Elem().Field(i)
			switch {
			case f.Type == reflect.TypeOf(netip.Addr{}):
				v.Set(reflect.ValueOf(netip.MustParseAddr("192.0.2.77")))
			case v.Kind() == reflect.String:
				v.SetString(v.String() + "x")
			case v.Kind() == reflect.Int || v.Kind() == reflect.Int64:
				v.SetInt(v.Int() + 1)
			case v.Kind() == reflect.Slice:
				v.Set(reflect.Append(v, reflect.Zero(f.Type.Elem())))
			case v.Kind() == reflect.Bool:
				v.SetBool(!v.Bool())
			default:
				t.Fatalf("field %s of kind %s: teach this test (and serviceSame) about it", f.Name, v.Kind())
			}
			assert.False(t, serviceSame(&base, &changed), "serviceSame misses a change of %s", f.Name)
			assert.True(t, serviceSame(&base, &base))
		})
	}
}

// TestStreamedFullSyncMatchesList: a full sync encoded while it is planned (as
// Sync does through netlink) is the same batch, byte for byte, as the listed
// transaction encoded afterwards, for every configuration, over an empty table
// and over one a previous sync left (stale chains and affinity sets to clean up).
func TestStreamedFullSyncMatchesList(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		cfg NFTablesConfig
		st  func() *State
	}{
		{sampleConfig(), sampleState},
		{NFTablesConfig{Table: "nodekit", MasqueradeAll: true, MasqueradeMark: 0x8000}, sampleState},
		{NFTablesConfig{ClusterCIDR: netip.MustParsePrefix("10.240.0.0/12"),
			ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("172.30.0.0/16")}}, sampleState},
		{sampleConfig6(), sampleState6},
	} {
		table := tc.cfg.Table
		if table == "" {
			table = DefaultNFTablesTable
		}
		w, err := newNFTablesWith(tc.cfg, knftables.NewFake(tc.cfg.Family.nft(), table))
		require.NoError(t, err)
		st := tc.st()
		for step, mutate := range []func(){
			func() {},
			func() { st.Services[1].Endpoints = st.Services[1].Endpoints[:1] },
			func() { st.Services[2].AffinityTimeout = time.Minute },
			func() { st.Services = st.Services[2:] },
			func() { st.Services[0].Endpoints = nil },
		} {
			mutate()
			w.ForceFullSync()
			listed, _, _, err := w.transaction(ctx, st, nil)
			require.NoError(t, err)
			want, wantKeys, err := newNetlinkApplier(tc.cfg.Family, w.cfg.Table).encode(listed)
			require.NoError(t, err)

			enc := newNetlinkApplier(tc.cfg.Family, w.cfg.Table)
			enc.seq = want.first
			streamed := &nftTx{stream: enc.newEncoder(0)}
			_, _, err = w.transactionInto(ctx, st, nil, streamed)
			require.NoError(t, err)
			require.NoError(t, streamed.err)
			assert.Empty(t, streamed.ops, "a streamed transaction keeps no list")
			assert.Equal(t, len(listed.ops), streamed.n)
			got, gotKeys := streamed.stream.(*nlEncoder).finish()
			assert.Equal(t, want.buf, got.buf, "%s %s step %d", tc.cfg.Family, tc.cfg.Table, step)
			assert.Equal(t, want.cmds, got.cmds)
			assert.Equal(t, wantKeys, gotKeys)

			require.NoError(t, w.Sync(ctx, st)) // the fake's table is what the next step cleans up
		}
	}
}

// TestStreamedFullSyncNamesFailingCommand: a kernel error on a streamed full sync
// names the command at fault, as a listed one does, by planning the sync again.
func TestStreamedFullSyncNamesFailingCommand(t *testing.T) {
	ctx := context.Background()
	w, err := newNFTablesWith(sampleConfig(), knftables.NewFake(knftables.IPv4Family, "kube-proxy"))
	require.NoError(t, err)
	st := sampleState()
	listed, _, _, err := w.transaction(ctx, st, nil)
	require.NoError(t, err)
	name := w.replayedOpNames(ctx, st)
	for i, op := range listed.ops {
		require.Equal(t, describeOp(op), name(i))
	}
	assert.Equal(t, fmt.Sprintf("command %d", len(listed.ops)), name(len(listed.ops)))
}
