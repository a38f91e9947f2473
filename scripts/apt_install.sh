# Sourced by the setup scripts that install a Debian package the tests need (setup_browser.sh,
# setup_prometheus.sh): apt_install WHAT NEEDED_BY PACKAGE... installs the packages (apt-get
# options such as --no-install-recommends may stand among them) with apt-get,
# as root or through a password-less sudo; without either (or without apt-get) it warns, naming
# NEEDED_BY and the command to run, and returns 0, so `make setup` goes on.
apt_install() {
  local what="$1" needed_by="$2"
  shift 2
  if ! command -v apt-get >/dev/null; then
    echo "WARNING: no apt-get to install $what: $needed_by needs the Debian package(s) $*." >&2
    return 0
  fi
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
      sudo="sudo -n"
    else
      echo "WARNING: installing $what needs root: run 'sudo apt-get install -y $*' ($needed_by needs it)." >&2
      return 0
    fi
  fi
  echo ">>> installing $what"
  # Wait for dpkg's lock rather than fail: make setup runs this beside setup_env.sh, which takes
  # the lock to install Java when it is missing.
  local wait_lock=(-o DPkg::Lock::Timeout=600)
  $sudo apt-get "${wait_lock[@]}" update -qq \
    && DEBIAN_FRONTEND=noninteractive $sudo apt-get "${wait_lock[@]}" install -y -qq "$@" >/dev/null
}
