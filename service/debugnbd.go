package service

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/filewrite/filewrite/service/internal/nbd"
)

// debugNBD is GET /debug/nbd: the NBD connections open now, oldest
// first, with their export (the file's path), whether it is read-only,
// TLS, structured replies, and the requests received and in flight. At
// most debugNBDLimit, JSON.
type debugNBD struct {
	srv *nbd.Server
}

const debugNBDLimit = 1000

func (d *debugNBD) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	rep := struct {
		Time        time.Time      `json:"time"`
		Open        int            `json:"open"`
		Connections []nbd.ConnInfo `json:"connections"`
	}{Time: time.Now(), Connections: []nbd.ConnInfo{}}
	if d.srv != nil {
		rep.Connections = d.srv.Conns()
	}
	rep.Open = len(rep.Connections)
	rep.Connections = rep.Connections[:min(len(rep.Connections), debugNBDLimit)]
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(rep)
}
