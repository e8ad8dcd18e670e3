package access

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"jetflow.dev/pkg/events"
)

// AdminTokenPrefix starts the admin tokens NewAdminToken makes.
const AdminTokenPrefix = "jfa_"

// NewAdminToken returns a new random admin token (jfa_ and 64 hex digits).
func NewAdminToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("access: random admin token: %w", err)
	}
	return AdminTokenPrefix + hex.EncodeToString(b), nil
}

// AdminTokens are the bootstrap admin tokens: the lines of a file (blank
// lines and lines starting with # are skipped), so that a fresh
// deployment can create its first keys. Only their SHA-256 hashes are
// kept in memory, and a token is compared with each in constant time.
// The file is read again when it changed, at most once per refresh
// interval: to rotate, add the new token, move the clients to it, and
// remove the old one.
type AdminTokens struct {
	path    string
	refresh time.Duration
	now     func() time.Time

	mu      sync.Mutex
	hashes  [][sha256.Size]byte
	checked time.Time
	modTime time.Time
	size    int64
}

// OpenAdminTokens reads the admin token file at path; refresh is how
// often it is looked at again (default 5s).
func OpenAdminTokens(path string, refresh time.Duration, now func() time.Time) (*AdminTokens, error) {
	if now == nil {
		now = time.Now
	}
	if refresh <= 0 {
		refresh = 5 * time.Second
	}
	a := &AdminTokens{path: path, refresh: refresh, now: now}
	if err := a.load(); err != nil {
		return nil, err
	}
	if len(a.hashes) == 0 {
		return nil, fmt.Errorf("access: admin token file %s holds no token", path)
	}
	return a, nil
}

// load reads the file if it changed since it was last read.
func (a *AdminTokens) load() error {
	st, err := os.Stat(a.path)
	if err != nil {
		return fmt.Errorf("access: admin token file: %w", err)
	}
	if st.ModTime().Equal(a.modTime) && st.Size() == a.size && a.hashes != nil {
		return nil
	}
	b, err := os.ReadFile(a.path)
	if err != nil {
		return fmt.Errorf("access: admin token file: %w", err)
	}
	var hashes [][sha256.Size]byte
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		hashes = append(hashes, sha256.Sum256([]byte(line)))
	}
	a.hashes, a.modTime, a.size = hashes, st.ModTime(), st.Size()
	return nil
}

// Match returns the admin principal if token is one of the file's.
func (a *AdminTokens) Match(token string) (Principal, bool) {
	a.mu.Lock()
	if now := a.now(); now.Sub(a.checked) >= a.refresh || now.Before(a.checked) {
		a.checked = now
		_ = a.load() // keep the tokens read before if the file is gone for a moment
	}
	hashes := a.hashes
	a.mu.Unlock()
	h := sha256.Sum256([]byte(token))
	found := -1
	for i, want := range hashes {
		if subtle.ConstantTimeCompare(h[:], want[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return Principal{}, false
	}
	return AdminPrincipal(hex.EncodeToString(h[:4])), true
}

// AdminPrincipal is the principal of an admin token whose hash starts
// with the hex prefix.
func AdminPrincipal(prefix string) Principal {
	return Principal{Subject: "admin-token", Method: events.ActorAPIKey, KeyID: "admin-token-" + prefix,
		Scopes: []Scope{ScopeAdmin}, Namespaces: []string{AllNamespaces}}
}
