package api

import (
	_ "embed"
	"net/http"
)

// openAPI is the api's OpenAPI 3.1 document: every route with its
// parameters, bodies, answers, errors and the scope it needs. It is the
// contract of the HTTP api, served as is. It is generated, by a test,
// from the route table, the wire types of package apiv1 and the prose of
// openapi_gen_test.go, and tests check that the server and pkg/client
// keep to it (docs/api.md#the-openapi-document).
//
//go:embed openapi.json
var openAPI []byte

// openAPIDocument answers GET /v1/openapi.json. It is public, like
// /healthz: the document holds nothing of any namespace, and a client
// generator or a browser needs it before it has a token.
func (s *Server) openAPIDocument(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(openAPI)
}
