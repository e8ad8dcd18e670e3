package auth

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Files in an auth directory (jetflow auth init, jetflow dev's
// DATA/auth). Seeds are private keys: the directory is created 0700 and
// every seed and creds file 0600.
const (
	// OperatorJWT and OperatorSeed are the operator's JWT and key.
	OperatorJWT  = "operator.jwt"
	OperatorSeed = "operator.nk"
	// SystemDir holds the system account (nats-server's own).
	SystemDir = "SYS"
	// AccountJWT and AccountSeed are, in a namespace's directory, its
	// account's JWT and key.
	AccountJWT  = "account.jwt"
	AccountSeed = "account.nk"
	// ServerConf is the nats-server configuration that trusts the
	// operator (include it from a server's configuration file).
	ServerConf = "server.conf"
	// RevokedFile, in a namespace's directory, lists the users whose
	// credentials the account revoked: a public key and an RFC 3339 time
	// per line (credentials issued before that time are refused).
	RevokedFile = "revoked"
)

// DefaultNamespace is the namespace of a single-tenant deployment.
const DefaultNamespace = "default"

// MaxControlLine is the protocol line length a server of jetflow's must
// accept: a user JWT, with its role's permissions, travels in CONNECT.
const MaxControlLine = 64 << 10

// CredsFile is the name of a role's credentials in its namespace directory.
func CredsFile(role Role) string { return string(role) + ".creds" }

// Trust is what a server needs to trust the operator: the operator's JWT,
// the system account and every account's JWT by public key.
type Trust struct {
	Operator      string
	SystemAccount string
	Accounts      map[string]string
	// Namespaces maps each namespace to its account's public key.
	Namespaces map[string]string
}

// InitConfig says what auth init issues.
type InitConfig struct {
	// Namespaces to make an account for. Default ["default"].
	Namespaces []string
	// AgentQueues are the queues of the agent identity issued in each
	// namespace. Default ["default"].
	AgentQueues []string
	// Reissue replaces the users' creds files even where they exist (jetflow
	// dev does, at every start, so that they carry this version's
	// permissions); otherwise existing ones are kept.
	Reissue bool
	// KeepKeys, with Reissue, signs the users again with the keys of their
	// existing creds files (a revoked one gets a new key): their JWTs carry
	// this version's permissions, and their public keys, so the inbox
	// prefixes services use, stay the same. jetflow dev does this at every
	// start, so that a service started beside it with its creds keeps
	// working across a restart. Without it Reissue makes new keys (a
	// rotation).
	KeepKeys bool
}

// Init makes the operator, the system account, an account per namespace
// and a user of each role in each, in dir; what exists already is kept
// (keys are never replaced), so that it can run at every start. It
// returns what a server needs to trust them.
func Init(dir string, c InitConfig) (*Trust, error) {
	if len(c.Namespaces) == 0 {
		c.Namespaces = []string{DefaultNamespace}
	}
	if len(c.AgentQueues) == 0 {
		c.AgentQueues = []string{"default"}
	}
	for _, ns := range c.Namespaces {
		if !ValidNamespace(ns) {
			return nil, fmt.Errorf("auth: namespace %q: %s", ns, NamespaceRule)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil { // it holds private keys
		return nil, fmt.Errorf("auth: %w", err)
	}
	op, err := loadOrCreate(filepath.Join(dir, OperatorSeed), nkeys.CreateOperator)
	if err != nil {
		return nil, err
	}
	sys, err := loadOrCreate(filepath.Join(dir, SystemDir, AccountSeed), nkeys.CreateAccount)
	if err != nil {
		return nil, err
	}
	sysPub, _ := sys.PublicKey()
	opPub, _ := op.PublicKey()
	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = "jetflow"
	oc.SystemAccount = sysPub
	opJWT, err := oc.Encode(op)
	if err != nil {
		return nil, fmt.Errorf("auth: sign operator: %w", err)
	}
	if err := writeFile(filepath.Join(dir, OperatorJWT), []byte(opJWT), 0o644); err != nil {
		return nil, err
	}
	t := &Trust{Operator: opJWT, SystemAccount: sysPub, Accounts: map[string]string{}, Namespaces: map[string]string{}}
	sc := jwt.NewAccountClaims(sysPub)
	sc.Name = "SYS"
	if t.Accounts[sysPub], err = sc.Encode(op); err != nil {
		return nil, fmt.Errorf("auth: sign system account: %w", err)
	}
	for _, ns := range c.Namespaces {
		acc, err := loadOrCreate(filepath.Join(dir, ns, AccountSeed), nkeys.CreateAccount)
		if err != nil {
			return nil, err
		}
		pub, _ := acc.PublicKey()
		ac := jwt.NewAccountClaims(pub)
		ac.Name = ns
		ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		revoked, err := readRevoked(filepath.Join(dir, ns, RevokedFile))
		if err != nil {
			return nil, err
		}
		for user, at := range revoked {
			ac.RevokeAt(user, at)
		}
		accJWT, err := ac.Encode(op)
		if err != nil {
			return nil, fmt.Errorf("auth: sign account %s: %w", ns, err)
		}
		if err := writeFile(filepath.Join(dir, ns, AccountJWT), []byte(accJWT), 0o644); err != nil {
			return nil, err
		}
		t.Accounts[pub], t.Namespaces[ns] = accJWT, pub
		for _, role := range Roles {
			path := filepath.Join(dir, ns, CredsFile(role))
			if _, err := os.Stat(path); err == nil && !c.Reissue {
				continue // issued before: keep it (services may be using it)
			}
			var user nkeys.KeyPair
			if c.KeepKeys {
				user = existingUserKey(path, revoked)
			}
			creds, err := IssueUserKey(acc, ns, role, c.AgentQueues, user)
			if err != nil {
				return nil, err
			}
			if err := writeFile(path, creds, 0o600); err != nil {
				return nil, err
			}
		}
	}
	if err := writeFile(filepath.Join(dir, ServerConf), []byte(t.ServerConfig()), 0o644); err != nil {
		return nil, err
	}
	return t, nil
}

// LoadAccount reads the key of a namespace's account from dir, to issue
// more users (jetflow auth user).
func LoadAccount(dir, ns string) (nkeys.KeyPair, error) {
	seed, err := os.ReadFile(filepath.Join(dir, ns, AccountSeed))
	if err != nil {
		return nil, fmt.Errorf("auth: namespace %s: %w (run jetflow auth init first)", ns, err)
	}
	return nkeys.FromSeed(seed)
}

// existingUserKey returns the user key of the creds file at path, or nil
// if there is none to keep (no file, not a creds file, or a revoked user).
func existingUserKey(path string, revoked map[string]time.Time) nkeys.KeyPair {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	kp, err := jwt.ParseDecoratedNKey(b)
	if err != nil {
		return nil
	}
	pub, err := kp.PublicKey()
	if err != nil || !nkeys.IsValidPublicUserKey(pub) {
		return nil
	}
	if _, gone := revoked[pub]; gone {
		return nil
	}
	return kp
}

// IssueUser signs a new user of role in the account acc (namespace ns)
// and returns its creds file content. queues apply to agents.
func IssueUser(acc nkeys.KeyPair, ns string, role Role, queues []string) ([]byte, error) {
	return IssueUserKey(acc, ns, role, queues, nil)
}

// IssueUserKey is IssueUser with the user's key (nil: a new one).
func IssueUserKey(acc nkeys.KeyPair, ns string, role Role, queues []string, user nkeys.KeyPair) ([]byte, error) {
	if user == nil {
		var err error
		if user, err = nkeys.CreateUser(); err != nil {
			return nil, fmt.Errorf("auth: %w", err)
		}
	}
	pub, _ := user.PublicKey()
	perms, err := PermissionsFor(role, queues, Inbox(pub))
	if err != nil {
		return nil, err
	}
	uc := jwt.NewUserClaims(pub)
	uc.Name = ns + "/" + string(role)
	if role == RoleAgent {
		uc.Name += "(" + strings.Join(queues, ",") + ")"
	}
	perms = perms.compact()
	uc.Permissions.Pub.Allow.Add(perms.PubAllow...)
	uc.Permissions.Pub.Deny.Add(perms.PubDeny...)
	uc.Permissions.Sub.Allow.Add(perms.SubAllow...)
	uc.Permissions.Sub.Deny.Add(perms.SubDeny...)
	userJWT, err := uc.Encode(acc)
	if err != nil {
		return nil, fmt.Errorf("auth: sign user %s: %w", uc.Name, err)
	}
	seed, err := user.Seed()
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	return jwt.FormatUserConfig(userJWT, seed)
}

// ServerConfig is the nats-server configuration that trusts the operator
// and knows every account (a memory resolver, preloaded).
func (t *Trust) ServerConfig() string {
	var b strings.Builder
	b.WriteString("# jetflow: trust the operator of jetflow's identities (generated by jetflow auth init).\n")
	fmt.Fprintf(&b, "operator: %q\n", t.Operator)
	fmt.Fprintf(&b, "system_account: %s\n", t.SystemAccount)
	fmt.Fprintf(&b, "# user JWTs carry their permissions in the CONNECT line\nmax_control_line: %d\n", MaxControlLine)
	b.WriteString("resolver: MEMORY\nresolver_preload: {\n")
	keys := make([]string, 0, len(t.Accounts))
	for k := range t.Accounts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "  %s: %q\n", k, t.Accounts[k])
	}
	b.WriteString("}\n")
	return b.String()
}

// OperatorClaims decodes the operator's JWT for an embedded server.
func (t *Trust) OperatorClaims() (*jwt.OperatorClaims, error) {
	return jwt.DecodeOperatorClaims(t.Operator)
}

// CredsUser reads a creds file: the user's public key and name.
func CredsUser(path string) (pub, name string, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", "", fmt.Errorf("auth: %w", err)
	}
	tok, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		return "", "", fmt.Errorf("auth: %s: %w", path, err)
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return "", "", fmt.Errorf("auth: %s: %w", path, err)
	}
	return uc.Subject, uc.Name, nil
}

// loadOrCreate reads a seed file, or makes a key and writes its seed.
func loadOrCreate(path string, create func() (nkeys.KeyPair, error)) (nkeys.KeyPair, error) {
	seed, err := os.ReadFile(path)
	if err == nil {
		kp, err := nkeys.FromSeed(seed)
		if err != nil {
			return nil, fmt.Errorf("auth: %s: %w", path, err)
		}
		return kp, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("auth: %w", err)
	}
	kp, err := create()
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	seed, err = kp.Seed()
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	if err := writeFile(path, seed, 0o600); err != nil {
		return nil, err
	}
	return kp, nil
}

// writeFile writes atomically, creating the parent directory 0700.
func writeFile(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("auth: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("auth: write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("auth: write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("auth: write %s: %w", path, err)
	}
	return nil
}

// NamespaceRule describes valid namespace names.
const NamespaceRule = "use 1 to 32 lower-case letters, digits or '-', starting with a letter"

// ValidNamespace reports whether ns can name a namespace.
func ValidNamespace(ns string) bool {
	if len(ns) < 1 || len(ns) > 32 || ns[0] < 'a' || ns[0] > 'z' {
		return false
	}
	for _, r := range ns {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' {
			return false
		}
	}
	return true
}

// ConnectOptions are the nats.go options of a connection with the
// identity in the creds file at path: the credentials and the user's own
// inbox prefix, which its permissions require.
func ConnectOptions(path string) ([]nats.Option, error) {
	pub, _, err := CredsUser(path)
	if err != nil {
		return nil, err
	}
	return []nats.Option{nats.UserCredentials(path), nats.CustomInboxPrefix(Inbox(pub))}, nil
}

// Revoke revokes, in namespace ns of the auth directory dir, the user of
// the creds file at path: the next Init writes the account with the user
// revoked, and a server that loads it (nats-server --signal reload, or a
// restart of jetflow dev) refuses those credentials. It returns the user's
// public key.
func Revoke(dir, ns, path string) (string, error) {
	pub, _, err := CredsUser(path)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(dir, ns, AccountSeed)); err != nil {
		return "", fmt.Errorf("auth: namespace %s: %w (run jetflow auth init first)", ns, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, ns, RevokedFile), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return "", fmt.Errorf("auth: %w", err)
	}
	defer f.Close()
	// One second later than now: the revocation covers JWTs issued up to
	// and including this second (JWT times have second precision).
	if _, err := fmt.Fprintf(f, "%s %s\n", pub, time.Now().Add(time.Second).UTC().Format(time.RFC3339)); err != nil {
		return "", fmt.Errorf("auth: %w", err)
	}
	return pub, nil
}

// readRevoked reads a revocations file (absent: none).
func readRevoked(path string) (map[string]time.Time, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	out := map[string]time.Time{}
	for i, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		pub, at, ok := strings.Cut(line, " ")
		t, err := time.Parse(time.RFC3339, strings.TrimSpace(at))
		if !ok || err != nil || !strings.HasPrefix(pub, "U") {
			return nil, fmt.Errorf("auth: %s:%d: want a user's public key and an RFC 3339 time", path, i+1)
		}
		out[pub] = t
	}
	return out, nil
}
