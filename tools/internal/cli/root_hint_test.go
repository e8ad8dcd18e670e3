package cli

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/tools/internal/devstack"
)

// TestDevHint: when the api the CLI looked for beside jetflow dev does
// not answer, the hint says what it found: a dev that does not answer
// (its connection file names it), a data directory with no dev running,
// a JETFLOW_DATA that names nothing, or nothing at all.
func TestDevHint(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	require.Equal(t, "no jetflow dev is running on the data directory "+data+" (jetflow dev, or make dev in a checkout, starts one)", devHint(data, false))

	b, err := json.Marshal(devstack.Conn{API: "http://127.0.0.1:18480", PID: 4242})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(data, devstack.ConnFile), b, 0o600))
	require.Equal(t, "the jetflow dev of "+data+" (process 4242) does not answer at http://127.0.0.1:18480: it is stopping, or it died (start it again: jetflow dev, or make dev in a checkout)",
		devHint(data, false))

	missing := filepath.Join(data, "nope")
	require.Equal(t, "JETFLOW_DATA="+missing+": no such data directory; name the one jetflow dev runs on", devHint(missing, true))
	require.Equal(t, "a jetflow dev with its data elsewhere: JETFLOW_DATA=DIR, or run the eval line it printed", devHint(missing, false))
}

// TestMainSaysWhatItFoundOfJetflowDev: Main gives the hint of the data
// directory JETFLOW_DATA names when the api its connection file names
// does not answer, and none when the api was named (--api).
func TestMainSaysWhatItFoundOfJetflowDev(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gone := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing answers there
	data := t.TempDir()
	b, err := json.Marshal(devstack.Conn{API: gone, PID: 4242})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(data, devstack.ConnFile), b, 0o600))
	t.Setenv("JETFLOW_DATA", data)
	t.Setenv("JETFLOW_API", "")
	var out, errOut bytes.Buffer
	code := Main(t.Context(), []string{"ls"}, &out, &errOut)
	require.Equal(t, ExitUnreachable, code, errOut.String())
	require.Contains(t, errOut.String(), "jetflow: the jetflow dev of "+data+" (process 4242) does not answer at "+gone)

	errOut.Reset()
	code = Main(t.Context(), []string{"ls", "--api", gone}, &out, &errOut)
	require.Equal(t, ExitUnreachable, code, errOut.String())
	require.NotContains(t, errOut.String(), "jetflow dev of", "the api was named: no hint about jetflow dev")
}
