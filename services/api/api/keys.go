package api

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"jetflow.dev/pkg/apiv1"
	"jetflow.dev/pkg/events"
	"jetflow.dev/services/api/access"
)

// viewKey is a key as the api shows it at now: never its token or hash.
func viewKey(k access.Key, now time.Time) apiv1.Key {
	var scopes []string
	for _, sc := range k.Scopes {
		scopes = append(scopes, string(sc))
	}
	v := apiv1.Key{ID: k.ID, Name: k.Name, Scopes: scopes, Namespaces: k.Namespaces, CreatedAt: k.CreatedAt, CreatedBy: k.CreatedBy,
		ExpiresAt: k.ExpiresAt, RevokedAt: k.RevokedAt, RevokedBy: k.RevokedBy, Status: "active"}
	switch {
	case !k.RevokedAt.IsZero():
		v.Status = "revoked"
	case !k.ExpiresAt.IsZero() && !now.Before(k.ExpiresAt):
		v.Status = "expired"
	}
	return v
}

// parseExpiresIn reads a Go duration, or a number of days ("30d").
func parseExpiresIn(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 1 || n > 3650 {
			return 0, fmt.Errorf("%q: give a number of days from 1 to 3650, or a duration such as 720h", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q: give a duration such as 720h, or days such as 30d", s)
	}
	return d, nil
}

// createKey answers POST /v1/admin/keys: a new api key, whose token is
// in this answer and nowhere else (the bucket keeps its hash).
func (s *Server) createKey(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
	if tooLarge(w, err, s.cfg.MaxBody) {
		return
	}
	var req apiv1.KeyRequest
	if err == nil {
		err = events.DecodeStrictJSON(body, &req)
	}
	if err != nil {
		field, msg := events.ExplainJSON(err)
		if field == "" {
			msg = `the body must be JSON like {"name":"ci","scopes":["read","start"],"namespaces":["default"],"expires_in":"30d"}: ` + msg
		}
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid_json", Field: field, Message: msg})
		return
	}
	invalid := func(field string, err error) {
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: field, Message: strings.TrimPrefix(err.Error(), "access: ")})
	}
	spec := access.KeySpec{Name: req.Name}
	if spec.Scopes, err = access.ParseScopes(req.Scopes); err != nil {
		invalid("scopes", err)
		return
	}
	if spec.Namespaces, err = access.ParseNamespaces(req.Namespaces); err != nil {
		invalid("namespaces", err)
		return
	}
	if spec.ExpiresIn, err = parseExpiresIn(req.ExpiresIn); err != nil {
		invalid("expires_in", err)
		return
	}
	if field, msg := spec.Check(); field != "" {
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: field, Message: field + " " + msg})
		return
	}
	p := principalOf(r)
	if why := access.CanGrant(p, spec.Scopes, spec.Namespaces); why != "" {
		writeError(w, http.StatusForbidden, apiError{Code: "forbidden", Message: "a key cannot grant more than its creator holds: " + why})
		return
	}
	k, token, err := s.keys.Create(r.Context(), spec, p)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	s.log.Info().Str("key_id", k.ID).Str("name", k.Name).Str("created_by", k.CreatedBy).Msg("api key created")
	v := viewKey(k, time.Now())
	v.Token = token // this once
	writeJSON(w, http.StatusCreated, v)
}

// listKeys answers GET /v1/admin/keys: the keys the caller could have
// made, without tokens or hashes.
func (s *Server) listKeys(w http.ResponseWriter, r *http.Request) {
	all, err := s.keys.List(r.Context())
	if err != nil {
		s.internal(w, r, err)
		return
	}
	p, now := principalOf(r), time.Now()
	out := []apiv1.Key{}
	for _, k := range all {
		if access.CanManage(p, k.Namespaces) {
			out = append(out, viewKey(k, now))
		}
	}
	slices.SortFunc(out, func(a, b apiv1.Key) int { return a.CreatedAt.Compare(b.CreatedAt) })
	writeJSON(w, http.StatusOK, apiv1.KeyList{Keys: out})
}

var keyIDRe = regexp.MustCompile(`^[0-9a-f]{16}$`)

// revokeKey answers DELETE /v1/admin/keys/{id}: the key stops working
// at once on this api, within the key cache TTL on other replicas.
func (s *Server) revokeKey(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	missing := func() {
		writeError(w, http.StatusNotFound, apiError{Code: "not_found", Field: "id", Message: fmt.Sprintf("no api key has the id %q", id)})
	}
	if !keyIDRe.MatchString(id) {
		missing()
		return
	}
	p := principalOf(r)
	k, _, err := s.keys.Get(r.Context(), id)
	if errors.Is(err, access.ErrKeyNotFound) || (err == nil && !access.CanManage(p, k.Namespaces)) {
		missing()
		return
	}
	if err != nil {
		s.internal(w, r, err)
		return
	}
	if k, err = s.keys.Revoke(r.Context(), id, p); err != nil {
		s.internal(w, r, err)
		return
	}
	s.log.Info().Str("key_id", k.ID).Str("name", k.Name).Str("revoked_by", k.RevokedBy).Msg("api key revoked")
	writeJSON(w, http.StatusOK, viewKey(k, time.Now()))
}
