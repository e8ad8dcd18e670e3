package partition_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/partition"
)

// vacancies lists how m found each partition's lease, for the holding it
// has now (VacancyUnknown for one it does not hold).
func vacancies(m *member, n int) []partition.Vacancy {
	out := make([]partition.Vacancy, n)
	for p := range n {
		if epoch, ok := m.table.Holds(p); ok {
			out[p] = m.table.Vacancy(p, epoch)
		}
	}
	return out
}

func all(n int, v partition.Vacancy) []partition.Vacancy {
	out := make([]partition.Vacancy, n)
	for p := range out {
		out[p] = v
	}
	return out
}

// TestVacancyTellsHowTheLastHolderLeft: a member taking a partition
// learns whether the lease was never held, given back by a holder that
// stopped, or left by one that died (expired), so that a dispatcher looks
// for what a dead holder left undone only when there may be some. A
// lease found under the member's own name (an earlier run of it) counts
// as expired.
func TestVacancyTellsHowTheLastHolderLeft(t *testing.T) {
	t.Parallel()
	s := natstest.RunJetStream(t)
	natstest.Connect(t, s) // the topology
	const n = 4

	a := startMember(t, s.ClientURL(), "a", n)
	coverage(t, n, 10*time.Second, a)
	require.Equal(t, all(n, partition.VacancyNever), vacancies(a, n), "a new deployment's leases were never held")

	a.cancel() // stops cleanly: deletes its leases once it let the partitions go
	<-a.done
	b := startMember(t, s.ClientURL(), "b", n)
	coverage(t, n, 10*time.Second, b)
	require.Equal(t, all(n, partition.VacancyReleased), vacancies(b, n), "a's leases were given back")

	b.close() // dies: its leases expire
	c := startMember(t, s.ClientURL(), "c", n)
	coverage(t, n, 10*time.Second, c)
	require.Equal(t, all(n, partition.VacancyExpired), vacancies(c, n), "b's leases expired")

}

// TestALeaseFoundUnderItsOwnNameCountsAsExpired: a take whose create is
// refused, the lease holding this member's name (a create whose answer
// was lost, or an earlier run of this member that died), adopts it; that
// run may have left work undone.
func TestALeaseFoundUnderItsOwnNameCountsAsExpired(t *testing.T) {
	t.Parallel()
	kv, tbl, _ := memberWithHooks(t, 2)
	_, err := kv.Create(t.Context(), partition.LeaseKey(0), []byte("a"), jetstream.KeyTTL(10*time.Second))
	require.NoError(t, err)
	for p := range 2 {
		tbl.AcquireNow(t.Context(), p)
	}
	require.EqualValues(t, 1, tbl.Adopted())
	e0, ok := tbl.Holds(0)
	require.True(t, ok)
	e1, ok := tbl.Holds(1)
	require.True(t, ok)
	require.Equal(t, partition.VacancyExpired, tbl.Vacancy(0, e0), "found under its own name")
	require.Equal(t, partition.VacancyNever, tbl.Vacancy(1, e1))
	require.Equal(t, partition.VacancyUnknown, tbl.Vacancy(0, e1), "a holding that is not p's")
}
