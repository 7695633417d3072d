// The OpenID provider the tests sign in with: panva's oidc-provider (OpenID Certified), configured from a
// JSON file (argv[2]): { port, issuer, clients: [...], users: { id: {email, name, groups, email_verified?} },
// jwks: {keys} }. Its one addition is the interaction: no login page, the person named by the authorization
// request's `login_hint` is signed in and consents at once (a test is the browser; the protocol is the
// provider's). Its people are read from the file at each use: a test changes someone's groups, or deletes
// them (offboarding), by rewriting it, and the provider's sessions, grants and refresh tokens live on.
import { readFileSync } from "node:fs";
import Provider from "oidc-provider";

const config = JSON.parse(readFileSync(process.argv[2], "utf8"));
const people = () => JSON.parse(readFileSync(process.argv[2], "utf8")).users;

const provider = new Provider(config.issuer, {
  clients: config.clients,
  jwks: config.jwks,
  findAccount: async (ctx, id) => {
    const person = people()[id];
    // `email_verified` as the person's entry says (absent: true); null: not sent at all, as Entra ID
    const verified = person?.email_verified === undefined ? true : person.email_verified;
    return (
      person && {
        accountId: id,
        claims: async () => ({
          sub: id,
          email: person.email,
          ...(verified === null ? {} : { email_verified: verified }),
          name: person.name,
          groups: person.groups,
        }),
      }
    );
  },
  claims: { openid: ["sub"], email: ["email", "email_verified"], profile: ["name"], groups: ["groups"] },
  scopes: ["openid", "email", "profile", "groups", "offline_access"],
  conformIdTokenClaims: false, // the person's claims in the ID token itself
  pkce: { required: () => true },
  // a refresh token with every sign-in, as Keycloak gives one (OpenID Connect's `offline_access` also
  // needs `prompt=consent` here, which the server does not send)
  issueRefreshToken: async (ctx, client) => client.grantTypeAllowed("refresh_token"),
  features: {
    devInteractions: { enabled: false },
    rpInitiatedLogout: { enabled: true },
    deviceFlow: { enabled: true },
  },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  ttl: { AuthorizationCode: 60, IdToken: 3600, AccessToken: 3600, Session: 3600, Interaction: 600, Grant: 3600 },
});

provider.use(async (ctx, next) => {
  const found = ctx.path.match(/^\/interaction\/([^/]+)$/);
  if (!found) return next();
  const details = await provider.interactionDetails(ctx.req, ctx.res);
  const accountId = details.params.login_hint || details.session?.accountId;
  if (!people()[accountId]) {
    ctx.status = 400;
    ctx.body = `unknown login_hint ${accountId}`;
    return undefined;
  }
  if (details.prompt.name === "login") {
    return provider.interactionFinished(ctx.req, ctx.res, { login: { accountId } }, { mergeWithLastSubmission: false });
  }
  const grant = details.grantId ? await provider.Grant.find(details.grantId) : new provider.Grant({ accountId, clientId: details.params.client_id });
  grant.addOIDCScope(details.params.scope);
  const grantId = await grant.save();
  return provider.interactionFinished(ctx.req, ctx.res, { consent: { grantId } }, { mergeWithLastSubmission: true });
});

provider.listen(config.port, "127.0.0.1", () => console.log(`listening ${config.issuer}`));
