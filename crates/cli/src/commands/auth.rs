//! `gangway auth`: edit the `--auth` file of `gangway server` (users and API tokens). Every
//! edit is an atomic write (temporary file, then rename); a running server picks it up on
//! SIGHUP. Passwords are read from standard input, never from the command line (where `ps`
//! would show them); a new token is printed once and stored only as its hash.

use std::io::BufRead;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use gangway_server::auth::file::grant;
use gangway_server::auth::{AuthFile, Grant, Role};

/// `gangway auth ...`.
#[derive(Debug, Args)]
pub struct AuthArgs {
    /// The auth file (TOML) that `gangway server --auth` loads; created when missing.
    #[arg(long, env = "GANGWAY_AUTH_FILE", value_name = "FILE")]
    pub file: PathBuf,
    #[command(subcommand)]
    pub command: AuthCommand,
}

/// What to edit.
#[derive(Debug, Subcommand)]
pub enum AuthCommand {
    /// Users: name + password (argon2id-hashed).
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
    /// API tokens (Authorization: Bearer).
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
}

/// `gangway auth user ...`.
#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Add a user; the password is the first line of standard input. A name that exists is
    /// refused: to change a password, `remove` then `add` (the login sessions made with the old
    /// one end when the server reloads).
    Add {
        /// Login name.
        name: String,
        #[command(flatten)]
        grant: GrantArgs,
    },
    /// Remove a user (its login sessions end when the server reloads).
    Remove {
        /// Login name.
        name: String,
    },
}

/// `gangway auth token ...`.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token and print it once.
    Create {
        #[command(flatten)]
        grant: GrantArgs,
        /// Free text stored with it (who or what uses it).
        #[arg(long, default_value = "")]
        description: String,
    },
    /// Remove a token by its id (the part after `gwt_`).
    Remove {
        /// Token id.
        id: String,
    },
}

/// One grant.
#[derive(Debug, Args)]
pub struct GrantArgs {
    /// read (list, watch, subscribe), write (register and update its instances) or admin
    /// (instances of others, service settings, deletes).
    #[arg(long, value_parser = clap::value_parser!(Role))]
    pub role: Role,
    /// Namespace the role holds on; `*` for every namespace.
    #[arg(long, default_value = "public")]
    pub namespace: String,
}

impl GrantArgs {
    fn grants(&self) -> Vec<Grant> {
        vec![grant(&self.namespace, self.role)]
    }
}

/// Runs one `gangway auth` command; what it prints goes to stdout.
pub fn run(args: AuthArgs) -> anyhow::Result<()> {
    let mut file = AuthFile::load_or_default(&args.file)?;
    match args.command {
        AuthCommand::User {
            command: UserCommand::Add { name, grant },
        } => {
            let password = read_password()?;
            file.add_user(&name, &password, grant.grants())?;
            file.save(&args.file)?;
            println!("user {name} added ({} on {})", grant.role, grant.namespace);
        }
        AuthCommand::User {
            command: UserCommand::Remove { name },
        } => {
            file.remove_user(&name)?;
            file.save(&args.file)?;
            println!("user {name} removed");
        }
        AuthCommand::Token {
            command: TokenCommand::Create { grant, description },
        } => {
            let token = file.create_token(&description, grant.grants());
            file.save(&args.file)?;
            // The only copy: the file keeps its hash. What it grants goes to stderr, so a
            // script that reads the token from stdout still gets one line.
            println!("{token}");
            eprintln!("token created ({} on {})", grant.role, grant.namespace);
        }
        AuthCommand::Token {
            command: TokenCommand::Remove { id },
        } => {
            file.remove_token(&id)?;
            file.save(&args.file)?;
            println!("token {id} removed");
        }
    }
    Ok(())
}

fn read_password() -> anyhow::Result<String> {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    let password = line.trim_end_matches(['\r', '\n']).to_owned();
    anyhow::ensure!(
        !password.is_empty(),
        "no password on standard input (e.g. `echo \"$PW\" | gangway auth user add ...`)"
    );
    Ok(password)
}
