use super::without_userinfo;

#[test]
fn without_home_the_aws_files_are_in_the_users_home() {
    use super::profile_files_without_home;
    assert!(profile_files_without_home(Some("/home/me".into()), Some("/root".into())).is_none());
    assert!(profile_files_without_home(None, None).is_none());
    let home = tempfile::tempdir().unwrap();
    assert!(profile_files_without_home(None, Some(home.path().into())).is_none());
    std::fs::create_dir(home.path().join(".aws")).unwrap();
    std::fs::write(home.path().join(".aws/credentials"), "[default]\n").unwrap();
    let files = format!(
        "{:?}",
        profile_files_without_home(None, Some(home.path().into())).unwrap()
    );
    assert!(files.contains(".aws/credentials"), "{files}");
    assert!(!files.contains(".aws/config"), "{files}");
}

#[test]
fn endpoint_userinfo_is_dropped() {
    assert_eq!(
        without_userinfo("http://127.0.0.1:9000"),
        "http://127.0.0.1:9000"
    );
    assert_eq!(
        without_userinfo("https://key:s3cr3t@minio.local:9000/base"),
        "https://minio.local:9000/base"
    );
    assert_eq!(without_userinfo("http://a@b@host/p@q"), "http://host/p@q");
    // A password holding `/`, and no scheme at all (attacker review).
    assert_eq!(
        without_userinfo("http://user:SEC/RETPW@127.0.0.1:9/"),
        "http://127.0.0.1:9/"
    );
    assert_eq!(without_userinfo("user:SECRETPW@host:9000"), "host:9000");
    assert_eq!(
        without_userinfo("http://host:9000/p@q"),
        "http://host:9000/p@q"
    );
}
