use super::build::single_host_url;
use super::*;
use crate::store::postgres::keepalive::TcpTimeouts;

fn labels(text: &str) -> Vec<String> {
    parse(text)
        .unwrap_or_else(|e| panic!("{text}: {e}"))
        .hosts
        .into_iter()
        .map(|h| h.label)
        .collect()
}

#[test]
fn one_host_url_is_as_before() {
    let info = parse("postgres://app:s%3Acret@db.example:6432/ledger?sslmode=disable").unwrap();
    assert_eq!(info.hosts.len(), 1);
    let options = &info.hosts[0].options;
    assert_eq!(options.get_host(), "db.example");
    assert_eq!(options.get_port(), 6432);
    assert_eq!(options.get_username(), "app");
    assert_eq!(options.get_database(), Some("ledger"));
    assert_eq!(info.hosts[0].label, "db.example:6432");
}

#[test]
fn url_host_lists_keep_each_hosts_port() {
    assert_eq!(
        labels("postgres://u@h1:5432,h2:5433,h3/db?target_session_attrs=read-write"),
        ["h1:5432", "h2:5433", "h3:5432"]
    );
    assert_eq!(
        labels("postgresql://u@[::1]:5433,10.0.0.2/db"),
        ["[::1]:5433", "10.0.0.2:5432"]
    );
}

#[test]
fn query_host_and_port_lists_as_libpq_reads_them() {
    // One port applies to every host; otherwise one per host.
    assert_eq!(
        labels("postgres:///db?host=a,b&port=6000&user=u"),
        ["a:6000", "b:6000"]
    );
    assert_eq!(
        labels("postgres://u@/db?host=a,b&port=6000,6001"),
        ["a:6000", "b:6001"]
    );
    let err = parse("postgres:///db?host=a,b,c&port=1,2").unwrap_err();
    assert!(err.contains("2 ports for 3 hosts"), "{err}");
}

#[test]
fn keyword_value_form() {
    let text = "host=h1,h2 port=5432,5433 user=settled password='it\\'s x' \
                dbname=ledger target_session_attrs=primary connect_timeout=3";
    assert!(is_keyword_form(text));
    let info = parse(text).unwrap();
    let labels: Vec<_> = info.hosts.iter().map(|h| h.label.as_str()).collect();
    assert_eq!(labels, ["h1:5432", "h2:5433"]);
    assert_eq!(info.hosts[1].options.get_username(), "settled");
    let url = single_host_url("h", "1", Some("u"), Some("it's x"), None, &[]);
    assert!(url.contains("it%27s%20x"), "{url}");
    assert_eq!(info.hosts[1].options.get_database(), Some("ledger"));
    assert_eq!(info.connect_timeout, Some(Duration::from_secs(3)));
    assert!(!is_keyword_form("postgres://h/db?a=b"));
    assert!(!is_keyword_form("settled.db"));
    let err = parse("host=h1 dbname").unwrap_err();
    assert!(err.contains("a keyword has no value"), "{err}");
}

#[test]
fn a_parameter_settled_would_not_honour_is_refused_by_name() {
    for (text, name) in [
        (
            "postgres://u@h/db?load_balance_hosts=random",
            "`load_balance_hosts=random`",
        ),
        (
            "postgres://u@h/db?gssencmode=require",
            "`gssencmode=require`",
        ),
        ("host=h service=x", "`service`"),
        ("postgres://u@h/db?foo=bar", "`foo`"),
    ] {
        let err = parse(text).unwrap_err();
        assert!(err.contains(name), "{text}: {err}");
    }
    for attrs in ["read-only", "standby", "prefer-standby"] {
        let err = parse(&format!("postgres://u@h/db?target_session_attrs={attrs}")).unwrap_err();
        assert!(err.contains("`target_session_attrs="), "{err}");
    }
    for attrs in ["read-write", "primary", "any"] {
        parse(&format!("postgres://u@h/db?target_session_attrs={attrs}")).unwrap();
    }
}

#[test]
fn the_password_never_appears_in_a_label_or_error() {
    let info = parse("postgres://u:hunter2@h1,h2/db").unwrap();
    assert!(info.hosts.iter().all(|h| !h.label.contains("hunter2")));
    let err = parse("postgres://u:hunter2@h1:notaport/db").unwrap_err();
    assert!(!err.contains("hunter2"), "{err}");
    // An unencoded `?` in a password splits the URL early: still not echoed.
    let err = parse("postgres://u:hun?ter2@h1/db").unwrap_err();
    assert!(!err.contains("hun"), "{err}");
    let err = parse("host=h password=hunter 2").unwrap_err();
    assert!(!err.contains("hunter") && !err.contains('2'), "{err}");
}

#[test]
fn tcp_timeouts_follow_the_flag_unless_the_string_says_otherwise() {
    let ten = TcpTimeouts::within(Duration::from_secs(10));
    assert_eq!(
        ten.keepalive,
        Some((Duration::from_secs(5), Duration::from_secs(1), 5))
    );
    assert_eq!(ten.user_timeout, Some(Duration::from_secs(10)));
    assert_eq!(TcpTimeouts::within(Duration::ZERO), TcpTimeouts::default());
    // Whole seconds, as the kernel takes them.
    assert_eq!(
        TcpTimeouts::within(Duration::from_millis(2000)).keepalive,
        Some((Duration::from_secs(1), Duration::from_secs(1), 1))
    );

    let info = parse("postgres://u@h/db?keepalives_idle=30&tcp_user_timeout=2500").unwrap();
    let t = info.tcp_timeouts(ten);
    assert_eq!(
        t.keepalive,
        Some((Duration::from_secs(30), Duration::from_secs(1), 5))
    );
    assert_eq!(t.user_timeout, Some(Duration::from_millis(2500)));
    let off = parse("postgres://u@h/db?keepalives=0&tcp_user_timeout=0").unwrap();
    assert_eq!(off.tcp_timeouts(ten), TcpTimeouts::default());
}

#[test]
fn what_sqlx_took_before_still_works() {
    // hostaddr, the application's own name, a port with no host, a bare IPv6 host.
    let info =
        parse("postgres://u@db.example/db?hostaddr=10.1.2.3&application_name=billing").unwrap();
    assert_eq!(
        info.hosts[0].address,
        Some("10.1.2.3:5432".parse().unwrap())
    );
    assert_eq!(
        info.hosts[0].options.get_application_name(),
        Some("billing")
    );
    let info = parse("postgres:///db?port=5433").unwrap();
    assert_eq!(info.hosts[0].options.get_port(), 5433);
    assert_eq!(
        labels("host=::1,10.0.0.2 port=5433 dbname=d"),
        ["::1:5433", "10.0.0.2:5433"]
    );
    assert_eq!(
        labels("postgres:///d?host=a,b&hostaddr=10.0.0.1,10.0.0.2"),
        ["a:5432", "b:5432"]
    );
    let err = parse("postgres:///d?host=a,b&hostaddr=10.0.0.1").unwrap_err();
    assert!(err.contains("1 addresses in hostaddr for 2 hosts"), "{err}");
}

#[test]
fn values_that_ask_for_nothing_new_are_accepted() {
    for ok in [
        "gssencmode=disable",
        "gssencmode=prefer",
        "channel_binding=prefer",
        "load_balance_hosts=disable",
        "client_encoding=UTF8",
        "fallback_application_name=x",
        "connect_timeout=0",
        "keepalives_idle=0",
    ] {
        parse(&format!("postgres://u@h/db?{ok}")).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    let err = parse("postgres://u@h/db?channel_binding=require").unwrap_err();
    assert!(err.contains("`channel_binding=require`"), "{err}");
    let info = parse("postgres://u@h/db?connect_timeout=1").unwrap();
    assert_eq!(info.connect_timeout, Some(Duration::from_secs(2)));
}
