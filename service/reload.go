package service

import (
	"errors"
)

// reloadOnSIGHUP is what a SIGHUP does: reread --auth-token-file, or,
// without one, nothing but a log line. A failed reload is logged and keeps
// the tokens in force.
func (s *Server) reloadOnSIGHUP() {
	if s.auth == nil {
		s.log.Info("SIGHUP ignored: there is no --auth-token-file to reread")
		return
	}
	s.auth.ReloadLogged()
}

// ReloadAuth rereads --auth-token-file, as SIGHUP does. It fails when
// authentication is off or the file holds no valid token; then the tokens
// in force stay.
func (s *Server) ReloadAuth() error {
	if s.auth == nil {
		return errors.New("authentication is off: no --auth-token-file")
	}
	return s.auth.Reload()
}
