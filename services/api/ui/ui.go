// Package ui is the operator's web UI: a page and its script, served by
// the api beside the JSON routes. The page holds no data: the script
// reads and acts through the same /v1 routes as the CLI, with the token
// the operator logs in with, so the UI can do exactly what that token's
// scopes allow and nothing the api would refuse. No build step and no
// Node toolchain: the files are written by hand and embedded as they are
// (docs/adr/0010-operator-ui.md says why).
package ui

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed static
var static embed.FS

// Prefix is where the UI's files are served; the page itself is at /.
const Prefix = "/ui/"

// securityHeaders keep the page to its own files: no inline script or
// style (an event's data can never run as script), no framing, no
// referrer, and no content sniffing.
var securityHeaders = map[string]string{
	"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
		"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
	"X-Content-Type-Options": "nosniff",
	"Referrer-Policy":        "no-referrer",
	"X-Frame-Options":        "DENY",
	"Cache-Control":          "no-cache",
}

// Handler serves the page at / and its files under Prefix. Mount it on
// "GET /{$}" and "GET /ui/".
func Handler() http.Handler {
	files, err := fs.Sub(static, "static")
	if err != nil { // the embedded tree is fixed at build time
		panic(err)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := "index.html"
		if r.URL.Path != "/" {
			name = strings.TrimPrefix(r.URL.Path, Prefix)
		}
		if name == "" || strings.Contains(name, "/") || path.Ext(name) == "" {
			http.NotFound(w, r)
			return
		}
		b, err := fs.ReadFile(files, name)
		if err != nil {
			http.NotFound(w, r)
			return
		}
		for k, v := range securityHeaders {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", contentType(name))
		if r.Method == http.MethodHead {
			return
		}
		_, _ = w.Write(b)
	})
}

func contentType(name string) string {
	switch path.Ext(name) {
	case ".html":
		return "text/html; charset=utf-8"
	case ".js":
		return "text/javascript; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	case ".svg":
		return "image/svg+xml"
	}
	return "application/octet-stream"
}
