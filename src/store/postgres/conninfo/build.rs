//! Each host of a parsed connection string as the one-host URL sqlx takes,
//! with the parameters settled passes on.

use std::str::FromStr;
use std::time::Duration;

use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use sqlx::postgres::PgConnectOptions;

use super::{ALREADY, ConnInfo, Host, PASSED, Parts, seconds};

impl Parts {
    pub(super) fn build(self) -> Result<ConnInfo, String> {
        let mut info = ConnInfo {
            hosts: Vec::new(),
            connect_timeout: None,
            keepalives: None,
            keepalives_idle: None,
            keepalives_interval: None,
            keepalives_count: None,
            tcp_user_timeout: None,
        };
        let mut hosts = self.hosts;
        let mut ports: Option<Vec<String>> = None;
        let mut hostaddrs: Option<Vec<String>> = None;
        let mut user = self.user;
        let mut password = self.password;
        let mut dbname = self.dbname;
        let mut passed = Vec::new();
        for (key, value) in self.params {
            match key.as_str() {
                "host" => {
                    hosts = value
                        .split(',')
                        .map(|h| (h.trim().to_owned(), String::new()))
                        .collect();
                }
                "port" => ports = Some(value.split(',').map(|p| p.trim().to_owned()).collect()),
                "hostaddr" => {
                    hostaddrs = Some(value.split(',').map(|a| a.trim().to_owned()).collect());
                }
                "user" => user = Some(value),
                "password" => password = Some(value),
                "dbname" => dbname = Some(value),
                "target_session_attrs" => match value.as_str() {
                    // settled writes: every form that may pick a primary picks one.
                    "read-write" | "primary" | "any" => {}
                    other => {
                        return Err(format!(
                            "`target_session_attrs={other}` cannot be honoured: settled writes, \
                             so it connects only to a server that accepts writes; use \
                             read-write (or primary, or leave it out)"
                        ));
                    }
                },
                // libpq takes at least 2 s.
                "connect_timeout" => {
                    info.connect_timeout =
                        seconds(&key, &value)?.map(|t| t.max(Duration::from_secs(2)));
                }
                "keepalives" => info.keepalives = Some(value.trim() != "0"),
                "keepalives_idle" => info.keepalives_idle = seconds(&key, &value)?,
                "keepalives_interval" => info.keepalives_interval = seconds(&key, &value)?,
                "keepalives_count" => {
                    let count: u32 = value.trim().parse().map_err(|_| {
                        format!("`keepalives_count` must be a whole number, not `{value}`")
                    })?;
                    info.keepalives_count = (count > 0).then_some(count);
                }
                "fallback_application_name" => {}
                k if ALREADY
                    .iter()
                    .any(|(name, ok)| *name == k && ok.contains(&value.trim())) => {}
                k if ALREADY.iter().any(|(name, _)| *name == k) => {
                    return Err(format!(
                        "`{k}={value}` cannot be honoured: the PostgreSQL driver settled uses \
                         does not do it; remove it from --database-url"
                    ));
                }
                "tcp_user_timeout" => {
                    info.tcp_user_timeout =
                        Some(Duration::from_millis(value.trim().parse().map_err(
                            |_| format!("`tcp_user_timeout` must be milliseconds, not `{value}`"),
                        )?));
                }
                k if PASSED.contains(&k) || (k.starts_with("options[") && k.ends_with(']')) => {
                    passed.push((key, value));
                }
                other => {
                    return Err(format!(
                        "the connection parameter `{other}` is not supported by settled; remove \
                         it from --database-url (supported: host, hostaddr, port, user, \
                         password, dbname, sslmode, sslrootcert, sslcert, sslkey, \
                         application_name, options, target_session_attrs, connect_timeout, \
                         keepalives, keepalives_idle, keepalives_interval, keepalives_count, \
                         tcp_user_timeout, and sqlx's statement-cache-capacity, ssl-mode, \
                         ssl-root-cert, ssl-cert, ssl-key, options[NAME])"
                    ));
                }
            }
        }
        if hosts.is_empty() {
            hosts.push((String::new(), String::new()));
        }
        if let Some(ports) = ports {
            match ports.len() {
                1 => hosts.iter_mut().for_each(|h| h.1.clone_from(&ports[0])),
                n if n == hosts.len() => {
                    for (h, p) in hosts.iter_mut().zip(ports) {
                        h.1 = p;
                    }
                }
                n => {
                    return Err(format!(
                        "{n} ports for {} hosts: give one port for all, or one per host",
                        hosts.len()
                    ));
                }
            }
        }
        let hostaddrs = match hostaddrs {
            None => vec![None; hosts.len()],
            Some(list) if list.len() == hosts.len() => list.into_iter().map(Some).collect(),
            Some(list) => {
                return Err(format!(
                    "{} addresses in hostaddr for {} hosts: give one per host",
                    list.len(),
                    hosts.len()
                ));
            }
        };
        for ((host, port), hostaddr) in hosts.into_iter().zip(hostaddrs) {
            if !port.is_empty() && port.parse::<u16>().is_err() {
                return Err("an invalid port in the host list (1..=65535)".to_owned());
            }
            let mut passed = passed.clone();
            let address = match hostaddr {
                Some(addr) => {
                    let ip: std::net::IpAddr = addr
                        .parse()
                        .map_err(|_| "hostaddr must be IP addresses".to_owned())?;
                    passed.push(("hostaddr".to_owned(), addr));
                    Some(ip)
                }
                None => None,
            };
            let url = single_host_url(
                &host,
                &port,
                user.as_deref(),
                password.as_deref(),
                dbname.as_deref(),
                &passed,
            );
            let options = PgConnectOptions::from_str(&url).map_err(|e| match e {
                sqlx::Error::Configuration(inner) => inner.to_string(),
                other => other.to_string(),
            })?;
            let shown_host = if host.is_empty() {
                options.get_host().to_owned()
            } else {
                host
            };
            info.hosts.push(Host {
                label: format!("{shown_host}:{}", options.get_port()),
                address: address.map(|ip| std::net::SocketAddr::new(ip, options.get_port())),
                options,
            });
        }
        Ok(info)
    }
}

fn enc(text: &str) -> String {
    utf8_percent_encode(text, NON_ALPHANUMERIC).to_string()
}

/// The one-host URL sqlx parses, for one host of the list.
pub(super) fn single_host_url(
    host: &str,
    port: &str,
    user: Option<&str>,
    password: Option<&str>,
    dbname: Option<&str>,
    passed: &[(String, String)],
) -> String {
    let mut url = String::from("postgres://");
    if let Some(user) = user {
        url.push_str(&enc(user));
        if let Some(password) = password {
            url.push(':');
            url.push_str(&enc(password));
        }
        url.push('@');
    }
    let mut query: Vec<String> = passed
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect();
    if host.starts_with('/') {
        // A Unix socket's directory goes in the query, as sqlx reads it.
        query.push(format!("host={}", enc(host)));
    } else if host.contains(':') && !host.starts_with('[') {
        // A bare IPv6 address, as libpq takes it in `host=`.
        url.push_str(&format!("[{host}]"));
    } else {
        url.push_str(host);
    }
    if !port.is_empty() {
        // With no host in the URL, a port there would not parse.
        if host.starts_with('/') || host.is_empty() {
            query.push(format!("port={port}"));
        } else {
            url.push(':');
            url.push_str(port);
        }
    }
    url.push('/');
    if let Some(db) = dbname {
        url.push_str(&enc(db));
    }
    if !query.is_empty() {
        url.push('?');
        url.push_str(&query.join("&"));
    }
    url
}
